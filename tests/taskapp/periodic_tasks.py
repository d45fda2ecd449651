"""Schedules of the periodic-task acceptance test (imported only by the
workers it starts: see tests/settings.py)."""

from shardq import periodic, shard_task


@periodic("* * * * * *")  # every second
@shard_task
def every_second() -> str:
    return "tick"


@periodic("* * * * * */2", name="every-two-seconds-with-args", args=(2,), kwargs={"label": "even"})
@shard_task
def labelled(n: int, label: str = "") -> str:
    return f"{label}:{n}"
