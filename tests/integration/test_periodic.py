"""Periodic tasks: schedules, tick arithmetic, and the scheduler against the table."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.tasks.exceptions import InvalidTask

from shardq import cron as periodic_module
from shardq.cron import CATCH_UP_SECONDS, due_ticks, periodic, schedules
from shardq.worker.scheduler import Scheduler
from shardq.worker.stats import Stats
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


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


def test_ticks_are_the_cron_times_in_the_half_open_window():
    periodic("*/5 * * * *", args=(1, 2))(tasks.add)
    [schedule] = schedules()
    assert due_ticks(schedule, at(2026, 1, 1, 0, 0), at(2026, 1, 1, 0, 15)) == [
        at(2026, 1, 1, 0, 5),
        at(2026, 1, 1, 0, 10),
        at(2026, 1, 1, 0, 15),
    ]
    assert due_ticks(schedule, at(2026, 1, 1, 0, 5), at(2026, 1, 1, 0, 9, 59)) == []


def test_a_sixth_field_is_seconds_and_the_newest_ticks_win_past_the_limit():
    periodic("* * * * * */10", args=(1, 2))(tasks.add)
    [schedule] = schedules()
    assert due_ticks(schedule, at(2026, 1, 1, 0, 0, 0), at(2026, 1, 1, 0, 0, 30)) == [
        at(2026, 1, 1, 0, 0, 10),
        at(2026, 1, 1, 0, 0, 20),
        at(2026, 1, 1, 0, 0, 30),
    ]
    assert due_ticks(schedule, at(2026, 1, 1), at(2026, 1, 1, 0, 1), limit=2) == [
        at(2026, 1, 1, 0, 0, 50),
        at(2026, 1, 1, 0, 1, 0),
    ]


def test_a_schedule_reads_its_cron_in_its_time_zone():
    periodic("0 3 * * *", timezone="Europe/Paris", args=(1, 2))(tasks.add)
    [schedule] = schedules()
    # 03:00 in Paris is 02:00 UTC in winter and 01:00 UTC in summer.
    assert due_ticks(schedule, at(2026, 1, 10), at(2026, 1, 11)) == [at(2026, 1, 10, 2)]
    assert due_ticks(schedule, at(2026, 7, 10), at(2026, 7, 11)) == [at(2026, 7, 10, 1)]


@pytest.mark.parametrize("cron", ["", "every minute", "61 * * * *", "* * *"])
def test_a_bad_cron_expression_fails_at_definition(cron):
    with pytest.raises(InvalidTask, match=r"is not a cron expression\. Use five fields"):
        periodic(cron)(tasks.add)


def test_bad_schedule_options_fail_at_definition_with_what_to_do():
    with pytest.raises(InvalidTask, match="is not an IANA time zone name"):
        periodic("* * * * *", timezone="Mars/Olympus")(tasks.add)
    with pytest.raises(InvalidTask, match="args and kwargs must be JSON"):
        periodic("* * * * *", kwargs={"when": object()})(tasks.add)
    with pytest.raises(InvalidTask, match="not a shardq task: put it above @shard_task"):
        periodic("* * * * *")(lambda: None)
    assert schedules() == []


def test_one_name_cannot_carry_two_schedules_but_a_reimport_is_harmless():
    periodic("*/5 * * * *", args=(1, 2))(tasks.add)
    periodic("*/5 * * * *", args=(1, 2))(tasks.add)  # the module imported again
    with pytest.raises(InvalidTask, match=r"already used .* Give each schedule of a task its own name="):
        periodic("0 * * * *", args=(1, 2))(tasks.add)
    periodic("0 * * * *", name="add-hourly", args=(1, 2))(tasks.add)
    assert sorted(s.name for s in schedules()) == ["add-hourly", "tests.taskapp.tasks.add"]


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
