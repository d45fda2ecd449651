"""Without ``shardq[rich]`` the commands' progress bars are plain text lines."""

import importlib.util
import io
import sys

from shardq.management import progress as installed


def load_without_rich(monkeypatch):
    for name in [n for n in sys.modules if n == "rich" or n.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich...` raises ImportError
    spec = importlib.util.spec_from_file_location("shardq_progress_without_rich", installed.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fallback_prints_the_label_and_the_count_without_rich(monkeypatch):
    plain = load_without_rich(monkeypatch)
    assert not plain.HAS_RICH
    out = io.StringIO()
    columns = (
        plain.TextColumn("pruning jobs"),
        plain.BarColumn(),
        plain.MofNCompleteColumn(),
        plain.TimeRemainingColumn(),
    )
    bar = plain.Progress(*columns, transient=True, disable=False, file=out, interval=0)
    task = bar.add_task("prune", total=10)
    with bar:
        bar.advance(task, 4)
        bar.update(task, advance=6)
    lines = out.getvalue().splitlines()
    assert lines[0] == "pruning jobs: 4/10"
    assert lines[-1] == "pruning jobs: 10/10"


def test_a_disabled_fallback_prints_nothing(monkeypatch):
    plain = load_without_rich(monkeypatch)
    out = io.StringIO()
    bar = plain.Progress(plain.TextColumn("x"), disable=True, file=out, interval=0)
    with bar:
        bar.advance(bar.add_task("x", total=1))
    assert out.getvalue() == ""
