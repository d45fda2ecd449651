"""Periodic tasks: schedules, tick arithmetic, and the scheduler against the table."""

from datetime import UTC, datetime, timedelta

import pytest

from shardq import cron as periodic_module
from shardq.cron import CATCH_UP_SECONDS, periodic, schedules
from shardq.worker.scheduler import Scheduler
from shardq.worker.stats import Stats
from tests.helpers import sql
from tests.integration.conftest import reset_task_backends
from tests.taskapp import tasks


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Each test registers into an empty registry (in-process workers of other
    tests must not find these schedules), with fresh backends: a backend's
    cache of unique keys outlives the rows a test's flush deletes."""
    monkeypatch.setattr(periodic_module, "_schedules", {})
    reset_task_backends()
    yield
    reset_task_backends()


def at(*parts) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_many_schedulers_offering_the_same_ticks_store_one_job_each():
    periodic("* * * * * */10", args=(20, 22))(tasks.add)
    a, b = (Scheduler(schedules(), Stats()) for _ in range(2))
    now = at(2026, 11, 30, 12, 0, 5)
    assert a.look(now) == b.look(now) == 1  # at start: the newest tick only (12:00:00)
    assert a.look(now + timedelta(seconds=20)) == 2  # 12:00:10 and 12:00:20
    assert b.look(now + timedelta(seconds=20)) == 2
    # A late look (the database was away) offers every tick it missed, within the catch-up window.
    assert a.look(now + timedelta(seconds=20 + CATCH_UP_SECONDS + 300)) == CATCH_UP_SECONDS // 10
    rows = sql("SELECT args::text, count(*) FROM shardq_job WHERE task_path = 'tests.taskapp.tasks.add' GROUP BY 1")
    assert rows == [("[20, 22]", 3 + CATCH_UP_SECONDS // 10)]
    keys = [k for (k,) in sql("SELECT key FROM shardq_unique ORDER BY key")]
    assert keys[:3] == [
        f"tests.taskapp.tasks.add:periodic:tests.taskapp.tasks.add:2026-11-30T12:00:{s}+00:00"
        for s in ("00", "10", "20")
    ]


@pytest.mark.django_db(transaction=True)
def test_after_a_long_gap_only_the_catch_up_window_is_enqueued():
    periodic("* * * * *", args=(1, 2))(tasks.add)
    scheduler = Scheduler(schedules(), Stats())
    assert scheduler.look(at(2026, 11, 30, 12, 0, 30)) == 1  # 12:00, caught up at start
    assert scheduler.look(at(2026, 11, 30, 18, 0, 30)) == 1  # 18:00, not the 359 minutes before
    assert sql("SELECT count(*) FROM shardq_job")[0][0] == 2
