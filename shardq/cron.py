"""Periodic (cron) tasks: one job per tick, however many workers run.

::

    @shardq.periodic("*/5 * * * *")          # every five minutes, UTC
    @shard_task
    def rollup(): ...

    # One task, several schedules: give each a name.
    shardq.periodic("0 3 * * *", name="report-eu", kwargs={"region": "eu"},
                    timezone="Europe/Paris")(report)

Every worker process runs a scheduler (``shardq/worker/scheduler.py``) that
looks about once a second for ticks that fell due since it last looked and
enqueues each as a *unique job* keyed by (schedule name, tick time): however
many workers see a tick, the table stores one job for it, and that job then
runs once like any other (at-least-once execution, exactly-once commit).

When a scheduler starts it offers the newest tick of the last
``CATCH_UP_SECONDS`` only: a restart does not lose the tick it straddled, and
a worker that was down for a week does not replay a week of ticks. While it
runs, a look that comes late (the database was unreachable) offers every tick
it missed, up to ``CATCH_UP_SECONDS`` back. Cron expressions take five fields (minute hour day month
weekday) or six with seconds last, as croniter reads them.
"""

import json
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.tasks import Task
from django.tasks.exceptions import InvalidTask

__all__ = ["CATCH_UP_SECONDS", "Schedule", "due_ticks", "periodic", "schedules"]

# How old a tick may be and still be enqueued (at a scheduler's start, or
# after the database was unreachable).
CATCH_UP_SECONDS = 60.0
# Most ticks of one schedule enqueued in one look (a per-second schedule after
# a long stall must not flood the table).
MAX_TICKS_PER_LOOK = 120

_schedules: dict[str, "Schedule"] = {}


@dataclass(frozen=True, slots=True)
class Schedule:
    """One cron schedule of one task, with the arguments each tick's job gets."""

    name: str
    task: Task
    cron: str
    timezone: ZoneInfo
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def unique_task(self, tick: datetime) -> Task:
        """The task as enqueued for ``tick``: unique by (schedule, tick).

        The key stays taken well past the catch-up window, so no scheduler
        that can still enqueue this tick finds the key free again."""
        key = f"periodic:{self.name}:{tick.astimezone(UTC).isoformat()}"
        return replace(self.task, unique_for=max(3600.0, 10 * CATCH_UP_SECONDS), unique_key=lambda args, kwargs: key)


def periodic(cron: str, *, name: str | None = None, args=(), kwargs=None, timezone: str = "UTC"):
    """Run the decorated task on a cron schedule (see the module docstring).

    Stack it on top of ``@shard_task`` (or Django's ``@task`` with shardq as
    the backend). Returns the task unchanged.
    """
    kwargs = dict(kwargs or {})

    def register_schedule(task):
        if not isinstance(task, Task) or not hasattr(task, "unique_for"):
            raise InvalidTask(
                f"@periodic({cron!r}) decorates {task!r}, not a shardq task: put it above "
                "@shard_task (or Django's @task with TASKS using shardq.backend.ShardqBackend)."
            )
        schedule_name = name or task.module_path
        where = f"{task.module_path} (schedule {schedule_name!r})"
        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise InvalidTask(
                f"{where}: {cron!r} is not a cron expression. Use five fields (minute hour day "
                "month weekday), e.g. '*/5 * * * *', or six with seconds last, e.g. '* * * * * */10'."
            )
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise InvalidTask(
                f"{where}: timezone={timezone!r} is not an IANA time zone name (e.g. 'UTC', 'Europe/Paris')."
            ) from exc
        try:
            json.dumps([list(args), kwargs], allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidTask(f"{where}: args and kwargs must be JSON ({exc}); pass ids, not objects.") from exc
        # The checks enqueue makes, here at import: a schedule whose arguments
        # enqueue would refuse must not reach the worker's scheduler loop.
        from .enqueue.arguments import dump_arguments, dump_keyword_arguments
        from .tasks import bind_arguments

        bind_arguments(task, tuple(args), kwargs)
        dump_arguments(task, tuple(args), kwargs)
        dump_keyword_arguments(task, kwargs)
        schedule = Schedule(schedule_name, task, cron, zone, tuple(args), kwargs)
        known = _schedules.get(schedule_name)
        if known is not None and (known.task.module_path, known.cron, known.timezone, known.args, known.kwargs) != (
            task.module_path,
            cron,
            zone,
            schedule.args,
            kwargs,
        ):
            raise InvalidTask(
                f"{where}: the schedule name {schedule_name!r} is already used by {known.task.module_path} "
                f"({known.cron!r}). Give each schedule of a task its own name=."
            )
        _schedules[schedule_name] = schedule
        return task

    return register_schedule


def schedules() -> list[Schedule]:
    """Every registered schedule (import the task modules first)."""
    return list(_schedules.values())


def due_ticks(schedule: Schedule, after: datetime, until: datetime, limit: int = MAX_TICKS_PER_LOOK) -> list[datetime]:
    """The schedule's ticks in ``(after, until]`` (aware datetimes), oldest
    first; the newest ``limit`` when there are more. The scheduler never asks
    for more than ``CATCH_UP_SECONDS``, so the walk stays short."""
    ticks: deque[datetime] = deque(maxlen=limit)
    if until <= after:
        return []
    it = croniter(schedule.cron, after.astimezone(schedule.timezone))
    while (tick := it.get_next(datetime)) <= until:
        ticks.append(tick)
    return list(ticks)
