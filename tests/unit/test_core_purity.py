"""shardq.core stays pure: importing it pulls in neither Django nor psycopg."""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import shardq.core

ROOT = Path(__file__).resolve().parents[2]


def core_modules():
    return sorted(f"shardq.core.{m.name}" for m in pkgutil.iter_modules(shardq.core.__path__))


def test_core_has_the_expected_modules():
    expected = {"hashing", "heap", "skiplist", "lru", "fifoset", "rwlock", "breaker", "localqueue"}
    assert {m.rsplit(".", 1)[1] for m in core_modules()} >= expected


# Runs first in the child: registers a bare ``shardq`` package so that only
# ``shardq.core`` code executes, not ``shardq/__init__.py`` (the public API,
# which is allowed to import Django).
BARE_PARENT = (
    "import sys, types\n"
    "pkg = types.ModuleType('shardq')\n"
    f"pkg.__path__ = [{str(ROOT / 'shardq')!r}]\n"
    "sys.modules['shardq'] = pkg\n"
)


def run_child(script):
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.process
def test_core_modules_themselves_import_no_django_or_psycopg():
    script = BARE_PARENT + (
        "import importlib, json, sys\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0].startswith(('django', 'psycopg')))))\n"
    )
    result = run_child(script)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.process
def test_importing_every_core_module_loads_no_django_or_psycopg():
    script = (
        "import importlib, json, sys\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0].startswith(('django', 'psycopg')))))\n"
    )
    # A fresh interpreter: this test process may already have Django loaded.
    result = run_child(script)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded == [], (
        "`import shardq.core.<x>` runs shardq/__init__.py first; it must not import "
        "Django eagerly (load the public API lazily with a module __getattr__). "
        f"Loaded: {loaded[:5]}"
    )


@pytest.mark.process
def test_core_modules_start_no_threads_and_read_no_clock_at_import():
    script = BARE_PARENT + (
        "import importlib, threading, time\n"
        "calls = []\n"
        "for name in ('time', 'monotonic', 'perf_counter', 'time_ns', 'monotonic_ns'):\n"
        "    real = getattr(time, name)\n"
        "    setattr(time, name, lambda *a, _n=name, _r=real: (calls.append(_n), _r(*a))[1])\n"
        "before = threading.active_count()\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "assert threading.active_count() == before, 'a thread was started'\n"
        "assert not calls, calls\n"
    )
    result = run_child(script)
    assert result.returncode == 0, result.stderr


def test_core_source_does_not_mention_forbidden_imports():
    for path in Path(shardq.core.__path__[0]).glob("*.py"):
        text = path.read_text()
        for word in (
            "import django",
            "from django",
            "import psycopg",
            "from psycopg",
            "time.time(",
            "time.monotonic(",
            "Thread(",
        ):
            assert word not in text, f"{path.name} contains {word!r}"
