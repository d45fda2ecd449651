"""``@shard_task`` and its Task subclass: the options a task carries (keys,
retries, order, uniqueness, salting, redaction marks), validated at definition."""

import hashlib
import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, Task
from django.tasks.base import DEFAULT_TASK_PRIORITY
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

from .. import conf
from ..core.limits import LimitError, check_concurrency, parse_rate
from ..core.tags import normalize_tags
from .keys import key_to_str


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``min(cap, base ** n)`` seconds,
    times a random factor in ``[1 - jitter, 1]`` so retries do not stampede."""

    base: float = 2.0
    cap: float = 600.0
    jitter: float = 0.25

    def delay(self, attempt: int) -> float:
        if self.cap <= 0:
            raw = 0.0
        elif self.base > 1 and attempt >= math.log(self.cap) / math.log(self.base):
            # Capped: the power is not computed. It made a number of
            # millions of digits for an int base (a minute of CPU for an
            # attempts written by hand) and overflowed a float one past
            # about 1,024 doublings (a task with a high max_attempts).
            raw = self.cap
        else:
            raw = min(self.cap, float(self.base) ** attempt)
        return raw * (1.0 - self.jitter * random.random())


def exponential(base: float = 2.0, cap: float = 600.0, jitter: float = 0.25) -> Backoff:
    if base < 1 or cap < 0 or not 0 <= jitter <= 1:
        raise ValueError("exponential() needs base >= 1, cap >= 0 and 0 <= jitter <= 1")
    return Backoff(base=base, cap=cap, jitter=jitter)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardTask(Task):
    """A Django ``Task`` with a shard key, retries and per-key order.

    ``key`` is the name of one of the function's arguments or a callable over
    ``(args, kwargs)``; jobs with the same key land on the same shard (and, for
    ``ordered=True``, run one after another). ``.using(shard_key=...)`` sets
    the key of one call explicitly.

    ``unique_for`` (seconds, or a ``timedelta``) makes the task unique: while
    a job with the same unique key was enqueued less than ``unique_for`` ago,
    ``enqueue`` stores nothing and returns that job's result. ``unique_key``
    says what "the same" means: None (every argument), the name of one
    argument, or a callable over ``(args, kwargs)``; see
    ``compute_unique_key``.

    ``salt=N`` spreads one hot key over N sub-keys (each job picks one at
    random), so its jobs can run on up to N shards at once; it gives up the
    key's order, so it cannot be combined with ``ordered=True``.

    ``sensitive`` marks arguments the admin must not show: a tuple of
    argument names, or True for every argument. Their values are stored as
    usual (the task needs them) and shown as ``"[redacted]"``; see
    ``redact_arguments``.
    """

    key: str | Callable[[tuple, dict], Any] | None = None
    shard_key: str | None = None
    # Limits that hold across every worker (docs/limits.md; shardq/limits.py):
    # jobs of this task running at once, starts per second/minute/hour, and
    # limit_by (an argument name or a callable over (args, kwargs)) to apply
    # both per value of that argument instead of to the task as a whole.
    max_concurrency: int | None = None
    rate_limit: str | None = None
    limit_by: str | Callable[[tuple, dict], Any] | None = None
    max_attempts: int = 1
    backoff: Backoff | None = None
    ordered: bool = False
    unique_for: float | timedelta | None = None
    unique_key: str | Callable[[tuple, dict], Any] | None = None
    sensitive: bool | tuple[str, ...] = ()
    salt: int | None = None
    # "retry": an attempt interrupted by a lost worker runs again
    # (at-least-once, up to SHARDQ["MAX_WORKER_LOSSES"]); "fail": the job ends
    # FAILED with WorkerLost instead (at-most-once, for tasks that must never
    # run twice).
    on_worker_lost: str = "retry"
    # Seconds an attempt may run (a number or timedelta); None: the default,
    # SHARDQ["TASK_TIMEOUT"]; math.inf: no limit whatever the default.
    timeout: float | timedelta | None = None
    # Workflows (shardq/workflows.py): jobs (TaskResults or their ids) this
    # call waits for, and what to do when one of them ends FAILED: "cancel"
    # (this job ends FAILED with ParentFailed) or "run" (it runs anyway and
    # reads the failure in context.parent_results). Set with .using(after=...).
    after: tuple[str, ...] = ()
    on_parent_failure: str = "cancel"
    # Fair share inside a queue (docs/fairness.md): fair_key (an argument
    # name or a callable over (args, kwargs)) names whose share a job counts
    # against; the worker shares its threads between the keys with backlog,
    # in proportion to their weights (fair_weight on the job, else
    # SHARDQ["FAIRNESS"]["WEIGHTS"], else 1), counting starts ("count") or
    # measured worker time ("time"). .using(fair_key=value) sets one call's
    # key (fair_key_value).
    fair_key: str | Callable[[tuple, dict], Any] | None = None
    fair_key_value: str | None = None
    fair_weight: int | None = None
    fair_by: str = "count"
    # Per-job logs (shardq/worker/joblogs.py): False keeps nothing this task
    # logs with its attempts (a task that logs what no operator should read).
    log: bool = True
    # Labels an operator finds the task's jobs by (docs/admin.md, "Tags and
    # search"): sorted, without duplicates (shardq.core.tags). .using(tags=...)
    # replaces them for one call.
    tags: tuple[str, ...] = ()

    @property
    def timeout_seconds(self) -> float | None:
        """The attempt's time limit in seconds (None: no limit), this task's
        ``timeout`` or else ``SHARDQ["TASK_TIMEOUT"]``."""
        if self.timeout is None:
            return conf.get_config().task_timeout_seconds
        return conf.timeout_seconds(self.timeout, "timeout")

    @property
    def unique_for_seconds(self) -> float | None:
        """``unique_for`` in seconds (None: the task is not unique)."""
        if self.unique_for is None:
            return None
        if isinstance(self.unique_for, timedelta):
            return self.unique_for.total_seconds()
        return float(self.unique_for)

    def using(
        self,
        *,
        shard_key=None,
        timeout=None,
        after=None,
        on_parent_failure=None,
        fair_key=None,
        fair_weight=None,
        tags=None,
        **changes,
    ):
        if isinstance(changes.get("run_after"), timedelta):
            # A delay from now (Django's own Task.using takes a datetime only).
            changes["run_after"] = timezone.now() + changes["run_after"]
        task = Task.using(self, **changes)
        if shard_key is not None:
            task = replace(task, shard_key=key_to_str(shard_key, "shard_key"))
        if timeout is not None:
            task = replace(task, timeout=timeout)  # validated by the backend, as at definition
        if after is not None:
            from ..workflows import parent_ids

            task = replace(task, after=tuple(str(i) for i in parent_ids(after, "using(after=...)")))
        if on_parent_failure is not None:
            from ..workflows import check_on_parent_failure

            task = replace(task, on_parent_failure=check_on_parent_failure(on_parent_failure))
        if fair_key is not None:
            task = replace(task, fair_key_value=fair_key_text(key_to_str(fair_key, "using(fair_key=...)")))
        if fair_weight is not None:
            task = replace(
                task, fair_weight=check_fair_weight(fair_weight, f"{self.module_path}: using(fair_weight=...)")
            )
        if tags is not None:
            try:
                task = replace(task, tags=normalize_tags(tags, f"{self.module_path}: using(tags=...)"))
            except ValueError as exc:
                raise InvalidTask(str(exc)) from None
        return task


def shard_task(
    function=None,
    *,
    key=None,
    priority=DEFAULT_TASK_PRIORITY,
    queue_name=DEFAULT_TASK_QUEUE_NAME,
    backend=DEFAULT_TASK_BACKEND_ALIAS,
    takes_context=False,
    max_attempts=1,
    backoff=None,
    ordered=False,
    unique_for=None,
    unique_key=None,
    sensitive=(),
    salt=None,
    on_worker_lost="retry",
    timeout=None,
    max_concurrency=None,
    rate_limit=None,
    limit_by=None,
    fair_key=None,
    fair_weight=None,
    fair_by="count",
    log=True,
    tags=(),
):
    """Decorate a module-level function as a shardq task (see ``ShardTask``)."""
    if isinstance(sensitive, (list, set, frozenset)):
        sensitive = tuple(sensitive)

    def wrapper(func):
        try:
            checked_tags = normalize_tags(tags, f"{func.__module__}.{func.__qualname__}: tags")
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None
        return ShardTask(
            func=func,
            key=key,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            max_attempts=max_attempts,
            backoff=backoff,
            ordered=ordered,
            unique_for=unique_for,
            unique_key=unique_key,
            sensitive=sensitive,
            salt=salt,
            on_worker_lost=on_worker_lost,
            timeout=timeout,
            max_concurrency=max_concurrency,
            rate_limit=rate_limit,
            limit_by=limit_by,
            fair_key=fair_key,
            fair_weight=fair_weight,
            fair_by=fair_by,
            log=log,
            tags=checked_tags,
        )

    if function is not None:
        return wrapper(function)
    return wrapper


def validate_shard_options(task: Task) -> None:
    """Definition-time checks of shardq's extra options (raises InvalidTask)."""
    if not isinstance(task, ShardTask):
        return
    name = task.module_path
    if task.key is not None:
        if isinstance(task.key, str):
            _check_argument_name(task, "key", task.key)
        elif not callable(task.key):
            raise InvalidTask(f"{name}: key must be an argument name or a callable, not {task.key!r}.")
    if not isinstance(task.max_attempts, int) or isinstance(task.max_attempts, bool) or task.max_attempts < 1:
        raise InvalidTask(f"{name}: max_attempts must be an int >= 1, not {task.max_attempts!r}.")
    if task.backoff is not None and not isinstance(task.backoff, Backoff):
        raise InvalidTask(f"{name}: backoff must come from shardq.exponential(...), not {task.backoff!r}.")
    _check_unique_options(task)
    _check_sensitive(task)
    _check_salt(task)
    _check_limits(task)
    _check_fairness(task)
    if task.on_worker_lost not in ("retry", "fail"):
        raise InvalidTask(
            f"{name}: on_worker_lost must be 'retry' (run again, at-least-once) or 'fail' "
            f"(at-most-once), not {task.on_worker_lost!r}."
        )
    _check_timeout(task)
    if not isinstance(task.log, bool):
        raise InvalidTask(
            f"{name}: log must be True (keep what the task logs with each attempt) or False, not {task.log!r}."
        )


def _check_timeout(task: "ShardTask") -> None:
    if task.timeout is None:
        # The default applies: a bad SHARDQ["TASK_TIMEOUT"] fails here, at
        # import, with ShardqConfigurationError, not in the worker.
        from django.conf import settings

        conf.default_timeout_seconds(getattr(settings, "SHARDQ", {}).get("TASK_TIMEOUT"))
        return
    try:
        conf.timeout_seconds(task.timeout, "timeout")
    except ValueError as exc:
        raise InvalidTask(f"{task.module_path}: {exc}") from None


# Sub-keys beyond the largest sensible shard count spread nothing further.
SALT_MAX = 16384


def _check_salt(task: "ShardTask") -> None:
    salt = task.salt
    if salt is None:
        return
    if not isinstance(salt, int) or isinstance(salt, bool) or not 2 <= salt <= SALT_MAX:
        raise InvalidTask(
            f"{task.module_path}: salt must be a whole number of sub-keys from 2 to {SALT_MAX} "
            f"(e.g. salt=8), not {salt!r}; leave it out for a key that is not hot."
        )
    if task.ordered:
        raise InvalidTask(
            f"{task.module_path}: salt={salt} spreads a key's jobs over several shards, so they "
            "cannot run in the key's order: drop ordered=True, or drop salt."
        )


def _check_limits(task: "ShardTask") -> None:
    """max_concurrency, rate_limit and limit_by (docs/limits.md).

    salt=N with limit_by of the key's argument is allowed and defined: the
    limit is held in PostgreSQL per value, so it holds across the N shards
    the salted key's jobs are spread over (salt spreads where jobs run, the
    limit still counts them together)."""
    name = task.module_path
    try:
        if task.max_concurrency is not None:
            check_concurrency(task.max_concurrency)
        if task.rate_limit is not None:
            parse_rate(task.rate_limit)
    except LimitError as exc:
        raise InvalidTask(f"{name}: {exc}") from None
    if task.limit_by is None:
        return
    if task.max_concurrency is None and task.rate_limit is None:
        raise InvalidTask(
            f"{name}: limit_by={task.limit_by!r} has nothing to apply per value: add "
            "max_concurrency=N and/or rate_limit='100/s', or drop limit_by."
        )
    if isinstance(task.limit_by, str):
        _check_argument_name(task, "limit_by", task.limit_by)
    elif not callable(task.limit_by):
        raise InvalidTask(
            f"{name}: limit_by must be the name of an argument or a callable over (args, kwargs), "
            f"not {task.limit_by!r}."
        )


def _check_fairness(task: "ShardTask") -> None:
    """fair_key, fair_weight and fair_by (docs/fairness.md)."""
    name = task.module_path
    if isinstance(task.fair_key, str):
        _check_argument_name(task, "fair_key", task.fair_key)
    elif task.fair_key is not None and not callable(task.fair_key):
        raise InvalidTask(
            f"{name}: fair_key must be the name of an argument or a callable over (args, kwargs), "
            f"not {task.fair_key!r}."
        )
    if task.fair_weight is not None:
        check_fair_weight(task.fair_weight, f"{name}: fair_weight")
    if task.fair_by not in FAIR_BY:
        raise InvalidTask(
            f"{name}: fair_by must be 'count' (shares of starts) or 'time' (shares of measured worker "
            f"time), not {task.fair_by!r}."
        )


#: What a fair share counts: starts, or measured worker time.
FAIR_BY = ("count", "time")
#: A job's fair weight is a whole number in this range (the column is an integer).
FAIR_WEIGHT_MAX = 10000
#: Fair keys longer than this are stored as their SHA-256, as limit keys are.
FAIR_KEY_MAX_CHARS = 200


def check_fair_weight(value: object, what: str) -> int:
    """A job's fair weight: a whole number from 1 to FAIR_WEIGHT_MAX (raises InvalidTask)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= FAIR_WEIGHT_MAX:
        raise InvalidTask(
            f"{what} must be a whole number from 1 to {FAIR_WEIGHT_MAX} (a key's share is its weight "
            f"over the sum of the weights of the keys with backlog), not {value!r}."
        )
    return value


def fair_key_text(text: str) -> str:
    """A fair key as stored: its text, or ``#sha256:<hex>`` of it when longer
    than FAIR_KEY_MAX_CHARS (as a limit key is written)."""
    if len(text) > FAIR_KEY_MAX_CHARS:
        return "#sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def _check_argument_name(task: "ShardTask", option: str, value: str) -> None:
    params = inspect.signature(task.func).parameters
    if value not in params or (task.takes_context and value == "context"):
        raise InvalidTask(
            f"{task.module_path}: {option}={value!r} is not an argument of the function "
            f"(its arguments: {', '.join(params) or 'none'}). Name one of them, "
            f"or pass a callable {option}=lambda args, kwargs: ..."
        )


# The database adds unique_for to a timestamp: keep far from interval's range.
UNIQUE_FOR_MAX_SECONDS = 100 * 365 * 86400


def _check_unique_options(task: "ShardTask") -> None:
    name = task.module_path
    unique_for = task.unique_for
    if unique_for is None:
        if task.unique_key is not None:
            raise InvalidTask(
                f"{name}: unique_key={task.unique_key!r} has no effect without unique_for. "
                "Add unique_for=<seconds or timedelta> (how long a key stays taken), or drop unique_key."
            )
        return
    if isinstance(unique_for, timedelta):
        seconds = unique_for.total_seconds()
    elif isinstance(unique_for, (int, float)) and not isinstance(unique_for, bool):
        seconds = float(unique_for)
    else:
        raise InvalidTask(
            f"{name}: unique_for must be a number of seconds or a datetime.timedelta, not "
            f"{unique_for!r}. E.g. unique_for=300 or unique_for=timedelta(minutes=5)."
        )
    if not math.isfinite(seconds) or not 0 < seconds <= UNIQUE_FOR_MAX_SECONDS:
        raise InvalidTask(
            f"{name}: unique_for must be a positive duration of at most 100 years, not "
            f"{unique_for!r}. It is how long a job's unique key stays taken after enqueue, e.g. "
            "unique_for=300; leave it out (None) for a task that is not unique."
        )
    if isinstance(task.unique_key, str):
        _check_argument_name(task, "unique_key", task.unique_key)
    elif task.unique_key is not None and not callable(task.unique_key):
        raise InvalidTask(
            f"{name}: unique_key must be None (every argument), the name of an argument, or a "
            f"callable over (args, kwargs), not {task.unique_key!r}."
        )


def _check_sensitive(task: "ShardTask") -> None:
    name = task.module_path
    value = task.sensitive
    if value is None or isinstance(value, bool):  # True: every argument; False/None: none
        return
    if not isinstance(value, tuple) or not all(isinstance(n, str) for n in value):
        raise InvalidTask(
            f"{name}: sensitive must be True (every argument) or a tuple of argument names, "
            f"e.g. sensitive=('password',), not {value!r}."
        )
    params = inspect.signature(task.func).parameters
    named = [n for n in params if not (task.takes_context and n == "context")]
    for arg in value:
        if arg not in named:
            raise InvalidTask(
                f"{name}: sensitive names {arg!r}, which is not an argument of the function "
                f"(its arguments: {', '.join(named) or 'none'}). Name its arguments, e.g. "
                f"sensitive=({(named or ['password'])[0]!r},), or sensitive=True for all of them."
            )
