"""docs/tasks.md names every task option, each under a heading of its own,
and its examples are Python."""

import inspect
import re
from pathlib import Path

import pytest
from django.tasks import Task

from shardq import periodic, shard_task
from shardq.tasks import ShardTask

DOC = (Path(__file__).resolve().parents[2] / "docs" / "tasks.md").read_text()
HEADINGS = set(re.findall(r"^###? `(\w+)`", DOC, re.M)) | set(re.findall(r"^### `\w+` and `(\w+)`", DOC, re.M))
# Not task options: the function itself.
NOT_OPTIONS = {"function"}


def option_names(*callables) -> set[str]:
    names = set()
    for f in callables:
        names |= {p.name for p in inspect.signature(f).parameters.values() if p.kind == p.KEYWORD_ONLY}
    return names - NOT_OPTIONS


def test_every_option_of_shard_task_and_using_has_a_heading():
    options = option_names(shard_task, Task.using, ShardTask.using)

    assert options - HEADINGS == set()


def test_every_argument_of_periodic_is_described():
    for name in {p.name for p in inspect.signature(periodic).parameters.values()} - {"cron"}:
        assert f"`{name}=`" in DOC, name


@pytest.mark.parametrize("block", re.findall(r"```python\n(.*?)```", DOC, re.S))
def test_each_example_is_python(block):
    compile(block, "docs/tasks.md", "exec")
