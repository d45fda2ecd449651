"""The pure half of cron schedules: ``due_ticks`` and the checks ``periodic``
makes at definition (the schedulers that store ticks are in
tests/integration/test_periodic.py)."""

from datetime import UTC, datetime

import pytest
from django.tasks.exceptions import InvalidTask

from shardq import cron as periodic_module
from shardq.cron import due_ticks, periodic, schedules
from tests.taskapp import tasks


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Each test registers into an empty registry."""
    monkeypatch.setattr(periodic_module, "_schedules", {})


def at(*parts) -> datetime:
    return datetime(*parts, tzinfo=UTC)


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
