"""Shared fixtures: real PostgreSQL only, and the two test tiers.

With DATABASE_URL unset the settings start the embedded server (pgserver);
pytest-django then creates the test database on whichever server it is.

Tiers (CONTRIBUTING.md): a test that starts a process (a worker, a
subprocess, a fork, a browser) is marked ``process``; the rest run in this
process and form the fast tier, ``pytest -m "not process"``. Whole
directories and the users of the ``workers`` and ``wheel`` fixtures are
marked here; anything else that starts a process carries the mark itself. A guard holds the line: an
unmarked test that starts a process fails, naming what it started.

Under pytest-xdist (``-n``) every xdist worker has a test database of its
own (pytest-django names it ``test_<name>_gw0``, ``_gw1``, ...), and the
worker processes a test starts join that database (tests/workers.py reads
it from Django's connection). That also gives each its own NOTIFY channels:
PostgreSQL delivers a NOTIFY only to listeners in the database it was sent
in, and advisory locks are per database as well. What is the whole
server's (pg_stat_activity, pg_locks) a test filters on its database.
"""

import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_until  # noqa: F401 (older tests import it from here)

WORKER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

TESTS = Path(__file__).resolve().parent
# Every test under these starts worker processes, servers or subprocesses.
PROCESS_DIRECTORIES = ("acceptance", "faults", "scale", "browser")
# Fixtures that start processes: worker processes, and the packaging tests'
# wheel build (pip, a fresh venv, the installed commands).
PROCESS_FIXTURES = {"workers", "wheel"}
# The audit events of starting a process (docs.python.org/3/library/audit_events.html).
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"})


# Under xdist (`--dist loadgroup`, as `make test` runs) the tests of one
# group run one after another on one xdist worker:
# - "demo": the demo's gunicorn takes port 8000 when it is free, so two demos
#   at once would both try it;
# - "wheel": the packaging tests share one wheel, built once a session (an
#   xdist worker is a session of its own);
# - a module whose tests share a module-scoped backlog (written once,
#   committed, deleted after the module): split over two xdist workers, each
#   would write it (the admin's 300,000-row month took 16 s on each).
XDIST_GROUPS = {
    "demo": ("example/test_demo.py",),
    "admin_plans": ("integration/test_admin_plans.py",),
    "claim_plan": ("integration/test_claim_plan.py",),
    "durable_plan": ("integration/test_durable_plan.py",),
}
XDIST_FIXTURE_GROUPS = {"wheel": "wheel"}
# The files whose tests use a grouped fixture: the scheduler (on xdist's
# controller, which collects nothing) groups by file; collection fails when a
# test elsewhere uses the fixture, so this list stays whole.
XDIST_FIXTURE_FILES = {"wheel": ("packaging/test_wheel.py", "packaging/test_readme.py")}


# Under xdist the longest tests go first, so that none starts last and runs
# alone at the end: directory by directory, the ones with the longest first
# (scale and faults run for tens of seconds each; unit tests in milliseconds).
XDIST_ORDER = ("scale", "faults", "packaging", "acceptance", "isolation", "browser", "example")


def _under_tests(item) -> Path:
    """The item's path inside tests/ (a test collected elsewhere, the example
    project's own, as ``example/...``: it is the example's layer)."""
    path = Path(str(item.path))
    return path.relative_to(TESTS) if path.is_relative_to(TESTS) else Path("example", path.name)


def pytest_itemcollected(item):
    """Each test's tier and xdist group marks, set as it is collected (the
    groups are formed by the scheduler below, from the same tables)."""
    path = _under_tests(item)
    if path.parts[0] in PROCESS_DIRECTORIES or PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.process)
    for group, paths in XDIST_GROUPS.items():
        if path.as_posix() in paths:
            item.add_marker(pytest.mark.xdist_group(group))
    for fixture, group in XDIST_FIXTURE_GROUPS.items():
        if fixture in getattr(item, "fixturenames", ()):
            if path.as_posix() not in XDIST_FIXTURE_FILES[group]:
                raise pytest.UsageError(
                    f"{item.nodeid} uses the fixture {fixture!r}: add {path.as_posix()!r} to "
                    f"XDIST_FIXTURE_FILES[{group!r}] in tests/conftest.py, so its tests share the group {group!r}"
                )
            item.add_marker(pytest.mark.xdist_group(group))


def _group_of_file(test_file: str) -> str | None:
    """The xdist group of a test file (its path inside tests/), if any."""
    for group, paths in (*XDIST_GROUPS.items(), *XDIST_FIXTURE_FILES.items()):
        if test_file in paths:
            return group
    return None


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups above. xdist 3.8 forms a group from
    a suffix it writes into each grouped test's node id (``...@group``), which
    pytest 9.2's node ids (built from ``Node._id``) no longer take: every
    test was its own unit, as under ``--dist load``. This scheduler groups by
    the test's file instead (tests/conftest.py's tables), as xdist would have."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            test_file = nodeid.split("::", 1)[0]
            group = _group_of_file(test_file.removeprefix("tests/"))
            return f"group:{group}" if group else super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker (each sorts alike: xdist checks they agree)
        first = {name: rank for rank, name in enumerate(XDIST_ORDER)}
        items.sort(key=lambda item: first.get(_under_tests(item).parts[0], len(first)))


class ProcessOutsideTier(RuntimeError):
    """An unmarked test started a process."""


# The test running now, when it is not marked ``process`` (None otherwise),
# and what it started: set around each test's setup, call and teardown.
_unmarked_test: pytest.Item | None = None
_started_outside_tier: list[str] = []


def _forbid_processes(event: str, args: tuple) -> None:
    # An audit hook sees every way a process starts (subprocess, fork,
    # posix_spawn, os.system), from any thread, with nothing patched.
    if _unmarked_test is None or event not in PROCESS_EVENTS:
        return
    what = f"{event} {args[1] if event == 'subprocess.Popen' else args[:2]!r}"
    _started_outside_tier.append(what)
    raise ProcessOutsideTier(
        f"{_unmarked_test.nodeid} started a process ({what}) but is not marked `process`: "
        'mark it (@pytest.mark.process), or keep it in-process, so that `pytest -m "not process"` starts none.'
    )


def pytest_configure(config):
    # croniter runs `file -b <python>` at import (platform.architecture()):
    # imported here, before any test, that is no test's process. (A whole
    # run imports it while collecting; a run of one test file may not.)
    import croniter  # noqa: F401

    sys.addaudithook(_forbid_processes)
    _hypothesis_without_wall_clock_checks()


def _hypothesis_without_wall_clock_checks() -> None:
    """Hypothesis's wall-clock checks off for every test: the 200 ms
    ``deadline`` an example may take, and the ``too_slow`` health check on
    generating inputs. On this shared 2-core machine, with other jobs on it,
    both failed tests whose properties held (test_tags.py, test_pools.py:
    "Input generation is slow ... 2 valid inputs after 3.45 seconds" at load
    28). Neither is part of any property: what each test checks, and how
    many examples it draws, are as written. Hypothesis's own ``ci`` profile
    turns off the same two in CI; this profile builds on whichever profile
    is loaded (``ci`` there, with its derandomize)."""
    from hypothesis import HealthCheck, settings

    base = settings.default
    settings.register_profile(
        "shardq-tests",
        settings(
            base,
            deadline=None,
            suppress_health_check=sorted({*base.suppress_health_check, HealthCheck.too_slow}, key=lambda c: c.value),
        ),
    )
    settings.load_profile("shardq-tests")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _unmarked_test
    _unmarked_test = None if item.get_closest_marker("process") else item
    try:
        return (yield)
    finally:
        _unmarked_test = None
        _started_outside_tier.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A phase that started a process fails even when the code it ran caught
    the guard's error."""
    report = yield
    started, _started_outside_tier[:] = list(_started_outside_tier), []
    if started and report.passed:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} started a process but is not marked `process`: {started}"
    pool = getattr(item, "funcargs", {}).get("workers")
    if report.failed and pool is not None:
        # A process test that fails in CI shows what its workers logged,
        # and where each live one's threads are (SIGUSR1: the worker's
        # stack dump): the traceback alone cannot say why a worker did not stop.
        import os
        import signal
        import time

        dumped = False
        for proc in pool.procs:
            if proc.poll() is None:
                for pid in [proc.pid, *pool.children(proc)]:
                    try:
                        os.kill(pid, signal.SIGUSR1)
                        dumped = True
                    except ProcessLookupError:
                        pass
        if dumped:
            time.sleep(1.0)
        for proc in pool.procs:
            try:
                tail = pool.log(proc)[-6000:]
            except OSError as exc:
                tail = f"(log unreadable: {exc})"
            report.sections.append((f"worker pid {proc.pid} log (last 6000 characters)", tail))
    return report


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, committing without waiting for the WAL
    flush (``synchronous_commit = off`` as the database's default, so the
    worker processes a test starts get it too). A transactional test commits
    every statement and flushes every table after it: on a shared disk each
    commit that waits for its fsync costs ~3 ms, against ~0.1 ms without.
    What changes is only what a crash of this server would lose, and no test
    crashes it (the fault tests that stop PostgreSQL start their own,
    tests/pgserver.py). ``SHARDQ_TEST_SYNC_COMMIT=on`` keeps the server's setting.
    Also keeps the rows post_migrate wrote for the flush to put back
    (tests/pgtest/base.py)."""
    import os

    from django.db import connections

    from tests.pgtest.base import keep_post_migrate_rows

    with django_db_blocker.unblock():
        for alias in connections:
            connection = connections[alias]
            if connection.vendor != "postgresql":
                continue
            keep_post_migrate_rows(connection)
            if os.environ.get("SHARDQ_TEST_SYNC_COMMIT", "off") == "off":
                with connection.cursor() as cursor:
                    name = connection.ops.quote_name(connection.settings_dict["NAME"])
                    cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
                # The setting is read when a session starts: Django's next connection has it.
                connection.close()
    yield django_db_setup


@pytest.fixture(autouse=True)
def forget_unique_keys():
    """After each test, the backends' caches of unique keys are emptied with
    the database they describe: a key cached by one test (its job since
    flushed or rolled back) would otherwise hand the next test, within the
    key's time to live, the id of a job that no longer exists. The faster
    the suite, the likelier (tests/integration/test_reshard.py met
    test_notify_payloads.py's key once)."""
    yield
    from django.tasks import task_backends

    for backend in task_backends.all(initialized_only=True):
        cache = getattr(getattr(backend, "unique", None), "cache", None)
        if cache is not None:
            cache.clear()


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """A test that runs the worker command in this process (call_command)
    installs the worker's stop handlers; put pytest's back afterwards, so a
    Ctrl-C still stops the run."""
    saved = {signum: signal.getsignal(signum) for signum in WORKER_SIGNALS}
    yield
    for signum, handler in saved.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)


@pytest.fixture
def second_connection(django_db_blocker):
    """A separate autocommit psycopg connection to the test database (to hold locks)."""
    from shardq.db.store import connect

    with django_db_blocker.unblock():
        conn = connect()
    yield conn
    conn.close()


@pytest.fixture
def workers(tmp_path, transactional_db):
    """Real ``shardq_worker`` processes on the test database (tests/workers.py)."""
    from shardq.db.store import ensure_shards
    from tests.workers import WorkerPool

    ensure_shards()  # a transactional test's flush may have removed the rows
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()


@pytest.fixture
def stepped(transactional_db):
    """One worker's stages in this process, stepped by the test and awaited
    through their test signals (tests/helpers.py ``SteppedWorker``), two
    executor threads, holding every shard. A test that needs other worker
    options uses ``with stepped_worker(concurrency=...)`` itself."""
    from tests.helpers import stepped_worker

    with stepped_worker(concurrency=2) as stages:
        yield stages
