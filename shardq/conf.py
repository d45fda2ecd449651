"""shardq's settings: ``settings.SHARDQ`` merged over the defaults."""

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings

from .exceptions import ShardqConfigurationError

DEFAULTS = {
    "SHARD_COUNT": 64,
    "LEASE_TTL": 30.0,
    "HEARTBEAT": 10.0,
    "POLL_INTERVAL": 1.0,
    "NOTIFY": True,
    "CHANNEL": "shardq",
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    "TASK_MODULES": [],
    "COMPLETION_BATCH": 256,
    "COMPLETION_FLUSH_SECONDS": 0.005,
    # A job whose attempt was interrupted by a lost worker runs again this
    # many times at most, then is dead-lettered as WorkerLost.
    "MAX_WORKER_LOSSES": 3,
    # A task's return value as JSON, at most: larger fails the job.
    "MAX_RESULT_BYTES": 1024 * 1024,
    # shardq_worker serves Prometheus metrics on this port (None: metrics off);
    # --metrics-port overrides it.
    "METRICS_PORT": None,
    # The address that port is bound to: this host only unless you say
    # otherwise (--metrics-address overrides it; 0.0.0.0 for every interface).
    "METRICS_ADDRESS": "127.0.0.1",
    # Count enqueues and cancels in this process (a web process's side of the
    # metrics, served by shardq.metrics.metrics_view): True, False, or None to
    # follow METRICS_PORT (counted where it is set).
    "ENQUEUE_METRICS": None,
    # The DATABASES alias shardq_worker connects through (None: the backend's
    # OPTIONS["DATABASE"]): a direct or session-pooled connection when the web
    # side goes through a transaction pooler (docs/scaling.md, "PgBouncer").
    "WORKER_DATABASE": None,
    # Seconds a task may run (None: no limit); @shard_task(timeout=...) wins.
    "TASK_TIMEOUT": None,
    # Threads still running a task past its timeout (stuck in C code) keep
    # their executor slot as zombies; past this many, or once one is older
    # than ZOMBIE_GRACE seconds, the worker process stops and is replaced.
    "MAX_ZOMBIES": 2,
    "ZOMBIE_GRACE": 300.0,
    # Queue limits, {"emails": {"max_concurrency": 20, "rate_limit": "50/s"}},
    # or a list of names (no limits); read by shardq/limits.py (docs/limits.md).
    "QUEUES": None,
    # A job whose task path a worker cannot resolve (a deploy in progress:
    # new code enqueued a task the old workers lack) is handed back, not
    # failed, for this many seconds; then it is dead-lettered naming the path.
    "UNKNOWN_TASK_TIMEOUT": 600.0,
    # History (docs/architecture.md, "History"): finished jobs leave shardq_job
    # for shardq_job_history, moved by the one worker that holds the archiver's
    # lock, HISTORY_GRACE seconds after they finished (fresh results are read
    # from the hot table), HISTORY_BATCH a statement. History is kept
    # HISTORY_DAYS days (a float: 10 / 1440 is ten minutes) in partitions of
    # HISTORY_PARTITION seconds each (a day), dropped whole once past it.
    # HISTORY False: nothing moves (shardq_prune deletes, as before).
    "HISTORY": True,
    "HISTORY_DAYS": 7.0,
    "HISTORY_GRACE": 60.0,
    "HISTORY_PARTITION": 86400,
    "HISTORY_BATCH": 5000,
    # Per-job logs (docs/tasks.md, "Logs"): what a task logs at this level or
    # above during an attempt is kept with the attempt and shown on the admin's
    # job page, at most JOB_LOG_BYTES bytes a job (0: no logs kept).
    "JOB_LOG_LEVEL": "INFO",
    "JOB_LOG_BYTES": 64 * 1024,
    # Dead-owner detection (docs/reliability.md, "A worker that dies"): a
    # worker whose lease connection's server session is gone (the process was
    # SIGKILLed, crashed, ran out of memory) has its shards taken over by the
    # survivors after DEAD_OWNER_CHECK seconds' checks have seen it gone for
    # two intervals, not after LEASE_TTL. Off behind a transaction pooler.
    "DEAD_OWNER_DETECTION": True,
    "DEAD_OWNER_CHECK": 0.1,
}


@dataclass(frozen=True, slots=True)
class Config:
    shard_count: int
    lease_ttl_seconds: float
    heartbeat_seconds: float
    poll_interval_seconds: float
    notify: bool
    channel: str
    max_payload_bytes: int
    task_modules: tuple
    completion_batch: int
    completion_flush_seconds: float
    max_worker_losses: int = 3
    max_result_bytes: int = 1024 * 1024
    task_timeout_seconds: float | None = None
    max_zombies: int = 2
    zombie_grace_seconds: float = 300.0
    unknown_task_timeout_seconds: float = 600.0
    history: "HistoryConfig | None" = None
    job_log_level: int = logging.INFO
    job_log_bytes: int = 64 * 1024
    dead_owner_detection: bool = True
    dead_owner_check_seconds: float = 0.1


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    """SHARDQ's HISTORY_* settings, validated (None in Config: HISTORY off)."""

    keep_seconds: float
    grace_seconds: float
    partition_seconds: int
    batch: int


def history_config(raw: dict[str, Any]) -> HistoryConfig | None:
    """The history settings of a merged SHARDQ dict; a bad value raises
    ShardqConfigurationError naming the key and what it should be."""
    if not raw["HISTORY"]:
        return None

    def number(key: str, low: float, what: str) -> float:
        value = raw[key]
        if isinstance(value, timedelta):
            value = value.total_seconds()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
            raise ShardqConfigurationError(f"SHARDQ[{key!r}] = {raw[key]!r} is not a number >= {low:g}: {what}.")
        return float(value)

    days = number("HISTORY_DAYS", 0, "the days finished jobs are kept in shardq_job_history (default 7)")
    grace = number("HISTORY_GRACE", 0, "seconds a finished job stays in shardq_job before it moves (default 60)")
    width = number("HISTORY_PARTITION", 60, "seconds of finish times a partition of shardq_job_history holds (86400)")
    batch = number("HISTORY_BATCH", 1, "jobs the archiver moves a statement (default 5000)")
    if width != int(width) or batch != int(batch):
        raise ShardqConfigurationError(
            "SHARDQ['HISTORY_PARTITION'] and SHARDQ['HISTORY_BATCH'] are whole numbers (seconds, jobs)."
        )
    return HistoryConfig(keep_seconds=days * 86400, grace_seconds=grace, partition_seconds=int(width), batch=int(batch))


def get_config() -> Config:
    raw = {**DEFAULTS, **getattr(settings, "SHARDQ", {})}
    return Config(
        shard_count=raw["SHARD_COUNT"],
        lease_ttl_seconds=float(raw["LEASE_TTL"]),
        heartbeat_seconds=float(raw["HEARTBEAT"]),
        poll_interval_seconds=float(raw["POLL_INTERVAL"]),
        notify=bool(raw["NOTIFY"]),
        channel=str(raw["CHANNEL"]),
        max_payload_bytes=int(raw["MAX_PAYLOAD_BYTES"]),
        task_modules=tuple(raw["TASK_MODULES"]),
        completion_batch=int(raw["COMPLETION_BATCH"]),
        completion_flush_seconds=float(raw["COMPLETION_FLUSH_SECONDS"]),
        max_worker_losses=int(raw["MAX_WORKER_LOSSES"]),
        max_result_bytes=int(raw["MAX_RESULT_BYTES"]),
        # Read leniently here, as the other keys are (a bad value is the
        # system check shardq.E012's to report, and a task defined under a
        # bad TASK_TIMEOUT raises); the defaults stand in meanwhile.
        task_timeout_seconds=_or_default(default_timeout_seconds, raw["TASK_TIMEOUT"], None),
        max_zombies=_or_default(max_zombies, raw["MAX_ZOMBIES"], DEFAULTS["MAX_ZOMBIES"]),
        zombie_grace_seconds=_or_default(zombie_grace_seconds, raw["ZOMBIE_GRACE"], DEFAULTS["ZOMBIE_GRACE"]),
        unknown_task_timeout_seconds=_or_default(
            unknown_task_timeout_seconds, raw["UNKNOWN_TASK_TIMEOUT"], DEFAULTS["UNKNOWN_TASK_TIMEOUT"]
        ),
        history=_or_default(history_config, raw, history_config(DEFAULTS)),
        job_log_level=_or_default(job_log_level, raw["JOB_LOG_LEVEL"], logging.INFO),
        job_log_bytes=_or_default(job_log_bytes, raw["JOB_LOG_BYTES"], DEFAULTS["JOB_LOG_BYTES"]),
        dead_owner_detection=_or_default(dead_owner_detection, raw["DEAD_OWNER_DETECTION"], True),
        dead_owner_check_seconds=_or_default(
            dead_owner_check_seconds, raw["DEAD_OWNER_CHECK"], DEFAULTS["DEAD_OWNER_CHECK"]
        ),
    )


def _or_default(parse: Callable[[Any], Any], value: object, default: Any) -> Any:
    try:
        return parse(value)
    except ShardqConfigurationError:
        return default


def timeout_seconds(value: object, what: str) -> float | None:
    """A task timeout in seconds: a positive number or ``timedelta``; None or
    ``math.inf`` for no limit. Anything else raises ``ValueError`` naming
    ``what`` (a bool, a string, NaN, zero, a negative number)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(
            f"{what} must be a number of seconds or a datetime.timedelta, not {value!r} "
            f"({type(value).__name__}); e.g. 30, or None for no limit."
        )
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(
            f"{what} must be a positive number of seconds, not {value!r}; e.g. 30, or None "
            "(float('inf') on a task) for no limit."
        )
    return None if math.isinf(seconds) else seconds


def default_timeout_seconds(value: object) -> float | None:
    try:
        return timeout_seconds(value, "SHARDQ['TASK_TIMEOUT']")
    except ValueError as exc:
        raise ShardqConfigurationError(str(exc)) from None


def max_zombies(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ShardqConfigurationError(
            f"SHARDQ['MAX_ZOMBIES'] = {value!r} is not an int >= 0: the number of threads stuck "
            "past their task's timeout a worker process keeps before it is replaced (default 2)."
        )
    return value


def zombie_grace_seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ShardqConfigurationError(
            f"SHARDQ['ZOMBIE_GRACE'] = {value!r} is not a positive number of seconds: how long a "
            "thread stuck past its task's timeout may stay before the worker process is replaced "
            "(default 300)."
        )
    return float(value)


def unknown_task_timeout_seconds(value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ShardqConfigurationError(
            f"SHARDQ['UNKNOWN_TASK_TIMEOUT'] = {value!r} is not a number of seconds >= 0: how long a "
            "job whose task a worker cannot resolve waits for a worker that can run it before it is "
            "dead-lettered (default 600; 0: at once)."
        )
    return float(value)


def unknown_task_retry_seconds(timeout_seconds: float) -> float:
    """How long a job whose task this worker cannot resolve waits before it
    is claimed again: a twentieth of the bound, from 0.2 s to 10 s."""
    return min(10.0, max(0.2, timeout_seconds / 20))


# The least JOB_LOG_BYTES other than 0: room for a line and the cut's mark.
MIN_JOB_LOG_BYTES = 256


def job_log_level(value: object) -> int:
    """SHARDQ["JOB_LOG_LEVEL"]: a level name ("INFO") or number, as logging's number."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        number = value
    elif isinstance(value, str):
        number = logging.getLevelNamesMapping().get(value.upper())
    if number is None:
        raise ShardqConfigurationError(
            f"SHARDQ['JOB_LOG_LEVEL'] = {value!r} is not a logging level: give a level name such as "
            "'INFO' or 'DEBUG' (or its number); a task's records at that level or above are kept "
            "with its attempt (default 'INFO')."
        )
    return number


def job_log_bytes(value: object) -> int:
    """SHARDQ["JOB_LOG_BYTES"]: 0 (no logs kept) or an int >= MIN_JOB_LOG_BYTES."""
    if isinstance(value, bool) or not isinstance(value, int) or (value != 0 and value < MIN_JOB_LOG_BYTES):
        raise ShardqConfigurationError(
            f"SHARDQ['JOB_LOG_BYTES'] = {value!r} is not 0 or an int >= {MIN_JOB_LOG_BYTES}: the bytes "
            "of log text a job keeps, its attempts together (default 65536; 0 keeps no logs)."
        )
    return value


def dead_owner_detection(value: object) -> bool:
    """SHARDQ["DEAD_OWNER_DETECTION"]: True or False."""
    if not isinstance(value, bool):
        raise ShardqConfigurationError(
            f"SHARDQ['DEAD_OWNER_DETECTION'] = {value!r} is not True or False: whether a worker takes over "
            "the shards of a peer whose database session is gone before its leases expire (default True)."
        )
    return value


#: DEAD_OWNER_CHECK's bounds: a hundred checks a second per worker at most;
#: slower than a minute is no faster than a typical LEASE_TTL.
MIN_DEAD_OWNER_CHECK, MAX_DEAD_OWNER_CHECK = 0.01, 60.0


def dead_owner_check_seconds(value: object) -> float:
    """SHARDQ["DEAD_OWNER_CHECK"]: seconds between a worker's checks for
    dead peers, a number (or ``timedelta``) in [0.01, 60]."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not MIN_DEAD_OWNER_CHECK <= value <= MAX_DEAD_OWNER_CHECK
    ):
        raise ShardqConfigurationError(
            f"SHARDQ['DEAD_OWNER_CHECK'] = {value!r} is not a number of seconds from "
            f"{MIN_DEAD_OWNER_CHECK:g} to {MAX_DEAD_OWNER_CHECK:g}: how often a worker looks for peers whose "
            "database session is gone (default 0.1; DEAD_OWNER_DETECTION = False turns detection off)."
        )
    return float(value)
