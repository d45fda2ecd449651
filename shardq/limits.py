"""Which limits apply to a job, and what each allows (docs/limits.md).

At enqueue, ``call_limits`` names the limits of one call (stored in
``shardq_job.limit_keys``; None for the common, unlimited job). In the
worker, ``spec_for_key`` turns a key back into what it allows, from the
task's decorator or ``SHARDQ["QUEUES"]``: capacity lives in code and
settings, never in the row, so changing a limit needs no data migration.
"""

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task
from django.tasks.exceptions import InvalidTask
from django.utils.crypto import salted_hmac

from .core.limits import MAX_KEY_CHARS, LimitError, LimitSpec, check_concurrency, parse_rate
from .tasks import ShardTask, key_to_str
from .tasks.keys import _bind, _short_repr

TASK_PREFIX = "t:"
QUEUE_PREFIX = "q:"
# Between the task path and a partition's value ("t:app.tasks.send=42"): a
# task path (a dotted Python name) never holds "=".
PARTITION = "="
# Between the task path and a partition's digest: a value too long for a key
# ("t:app.tasks.send#sha256:<hex>") or the value of a sensitive argument
# ("t:app.tasks.send#hmac:<hex>", keyed with SECRET_KEY). A raw value always
# follows "=", and a task path never holds "#", so no raw value -- not even
# "#sha256:<hex>" -- gives the key of a hashed one (as unique keys do).
HASHED = "#"
LONG_VALUE_MARK = HASHED + "sha256:"
SENSITIVE_VALUE_MARK = HASHED + "hmac:"
_UNITS = {1.0: "s", 60.0: "m", 3600.0: "h"}


def queue_limits() -> dict[str, LimitSpec]:
    """``SHARDQ["QUEUES"]`` as {queue: LimitSpec} (raises ImproperlyConfigured).

    A list (or tuple) of queue names, or nothing, means no queue limits; a
    dict maps a queue name to ``{"max_concurrency": N, "rate_limit": "50/s"}``
    (either or both)."""
    raw = getattr(settings, "SHARDQ", {}).get("QUEUES")
    if raw is None or isinstance(raw, (list, tuple)):
        if raw is not None and not all(isinstance(q, str) for q in raw):
            raise ImproperlyConfigured(f'SHARDQ["QUEUES"] as a list must hold queue names (str), not {raw!r}.')
        return {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            'SHARDQ["QUEUES"] must be a list of queue names or a dict of queue name -> limits, e.g. '
            f'{{"emails": {{"max_concurrency": 20, "rate_limit": "50/s"}}}}, not {raw!r}.'
        )
    limits = {}
    for queue, options in raw.items():
        where = f'SHARDQ["QUEUES"][{queue!r}]'
        if not isinstance(queue, str) or not queue:
            raise ImproperlyConfigured(f'SHARDQ["QUEUES"]: a queue name must be a non-empty str, not {queue!r}.')
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise ImproperlyConfigured(
                f'{where} must be a dict like {{"max_concurrency": 20, "rate_limit": "50/s"}} (or {{}}), '
                f"not {options!r}."
            )
        # fair_key is read by shardq/fairness.py (docs/fairness.md).
        unknown = set(options) - {"max_concurrency", "rate_limit", "fair_key"}
        if unknown:
            raise ImproperlyConfigured(
                f"{where} has unknown option(s) {', '.join(sorted(map(repr, unknown)))}: "
                "a queue takes max_concurrency, rate_limit and fair_key."
            )
        try:
            cap = options.get("max_concurrency")
            rate = options.get("rate_limit")
            spec = LimitSpec(
                max_concurrency=None if cap is None else check_concurrency(cap, f"{where}['max_concurrency']"),
                rate=None if rate is None else parse_rate(rate, f"{where}['rate_limit']"),
            )
        except LimitError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        if spec.max_concurrency is not None or spec.rate is not None:
            limits[queue] = spec
    return limits


def task_spec(task: Task) -> LimitSpec | None:
    """The task's own limit (None: it has none)."""
    if not isinstance(task, ShardTask) or (task.max_concurrency is None and task.rate_limit is None):
        return None
    return LimitSpec(
        max_concurrency=task.max_concurrency,
        rate=None if task.rate_limit is None else parse_rate(task.rate_limit),
    )


def static_keys(task: Task, queues: dict[str, LimitSpec]) -> list[str] | None:
    """The limit keys every call of ``task`` has, sorted (None: none); a
    task limited ``limit_by`` adds its partition's key per call (``call_limits``)."""
    keys = []
    if task_spec(task) is not None and not getattr(task, "limit_by", None):
        keys.append(TASK_PREFIX + task.module_path)
    if task.queue_name in queues:
        keys.append(QUEUE_PREFIX + task.queue_name)
    return sorted(keys) or None


def call_limits(
    task: Task, args: tuple, kwargs: dict, shard_key: str | None, queues: dict[str, LimitSpec]
) -> tuple[list[str] | None, bool]:
    """The limit keys of one call (sorted; None: none) and whether its limit
    is kept by the owner of its shard key instead (``key_limited``).

    A ``limit_by`` partition whose value is the call's shard key, of a task
    with ``max_concurrency`` and nothing else limiting it (no rate limit, no
    queue limit) and no ``salt``, needs no coordination: every job of that
    value is in one shard, and one worker of a pool owns it. Such a call gets
    no limit keys (the ordinary claim takes it) and ``key_limited``: the
    owner's local queue runs at most ``max_concurrency`` of the key at once
    (docs/limits.md, "Limits by the shard key"). Every other partition is a
    key of the slot table, as before."""
    keys = static_keys(task, queues) or []
    by = getattr(task, "limit_by", None)
    if by is not None:
        text = partition_text(task, by, args, kwargs)
        sensitive = limit_by_is_sensitive(task)
        if (
            not sensitive
            and not keys
            and shard_key is not None
            and text == shard_key
            and getattr(task, "rate_limit", None) is None
            and getattr(task, "max_concurrency", None) is not None
            and not getattr(task, "salt", None)
        ):
            return None, True
        keys.append(TASK_PREFIX + task.module_path + partition_suffix(text, sensitive))
    return sorted(keys) or None, False


def partition_suffix(text: str, sensitive: bool) -> str:
    """What follows the task path in a partition's limit key: ``=<value>``,
    or a marked digest for a sensitive value (keyed: a plain hash of a short
    secret is found by trying values) or one too long for a key."""
    if sensitive:
        digest = salted_hmac("shardq.limit_by", text, algorithm="sha256").hexdigest()
        return SENSITIVE_VALUE_MARK + digest
    if len(text) > MAX_KEY_CHARS:
        return LONG_VALUE_MARK + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return PARTITION + text


def limit_by_is_sensitive(task: Task) -> bool:
    """Whether a ``limit_by`` value may be a sensitive argument's: it names
    one, or the task marks every argument (sensitive=True), or it is a
    callable of a task that marks any (what it returns is unknown). Such a
    value is never written into a limit key as it is: the Limits page,
    ``shardq_status`` and the job list would show it."""
    marked = getattr(task, "sensitive", ())
    if marked is True:
        return True
    by = getattr(task, "limit_by", None)
    if not marked or by is None:
        return False
    return callable(by) or by in marked


def key_task_path(key: str) -> str:
    """The task path of a task limit key (``t:<path>``, ``t:<path>=<value>``
    or ``t:<path>#<digest>``)."""
    body = key[len(TASK_PREFIX) :]
    return body.partition(PARTITION)[0].partition(HASHED)[0]


def is_partition_key(key: str) -> bool:
    return key.startswith(TASK_PREFIX) and key_task_path(key) != key[len(TASK_PREFIX) :]


def partition_text(task: Task, by: str | Callable[[tuple, dict], Any], args: tuple, kwargs: dict) -> str:
    """The value a ``limit_by`` call is limited by, as key text (as a shard key is written)."""
    if callable(by):
        value = by(args, kwargs)
        what = f"returned by limit_by={getattr(by, '__qualname__', type(by).__name__)}"
    elif by in kwargs:
        value, what = kwargs[by], f"(argument {by!r} of limit_by)"
    else:
        value, what = _bind(task, args, kwargs, apply_defaults=True)[by], f"(argument {by!r} of limit_by)"
    try:
        text = key_to_str(value, what)
    except InvalidTask as exc:
        raise InvalidTask(
            f"{task.module_path}: the limit_by value {what} = {_short_repr(value)} cannot be a limit "
            "key (a str, int or JSON value without NUL characters): make limit_by name such an "
            f"argument or return such a value. ({exc})"
        ) from None
    return text


def spec_for_key(key: str, resolve: Callable[[str], Task | None], queues: dict[str, LimitSpec]) -> LimitSpec | None:
    """What the limit ``key`` allows, from this process's tasks and
    settings; None when it does not know the limit (a task no longer
    defined here, a queue limit removed from settings): the job is then
    not held back (it fails as an unknown task, or runs unlimited)."""
    if key.startswith(QUEUE_PREFIX):
        return queues.get(key[len(QUEUE_PREFIX) :])
    if key.startswith(TASK_PREFIX):
        task = resolve(key_task_path(key))
        return None if task is None else task_spec(task)
    return None


class KeyCaps:
    """task path -> the ``max_concurrency`` its key_limited jobs are held to
    per shard key (None: the task is not defined here with a limit_by and a
    cap, so the job is not held back), for the worker's local queue
    (``Buffer``). Read from the task as defined in this process, as
    ``spec_for_key`` reads the slot table's limits; remembered per path, at
    most ``size`` of them (a row can name any path)."""

    def __init__(self, resolve: Callable[[str], Task | None], size: int = 1024) -> None:
        self._resolve = resolve
        self._size = size
        self._caps: dict[str, int | None] = {}

    def __call__(self, path: str) -> int | None:
        try:
            return self._caps[path]
        except KeyError:
            pass
        try:
            task = self._resolve(path)
        except Exception:  # an unknown or broken task: not held back here
            task = None
        cap = None
        if isinstance(task, ShardTask) and task.limit_by is not None and task.max_concurrency is not None:
            cap = task.max_concurrency
        if len(self._caps) >= self._size:
            self._caps.clear()
        self._caps[path] = cap
        return cap


def configured_queue_limits() -> dict[str, LimitSpec]:
    """``queue_limits()``, for ready(): a bad setting stops the process at start."""
    try:
        return queue_limits()
    except ImproperlyConfigured:
        raise
    except Exception as exc:  # an odd object in settings: still a settings error
        raise ImproperlyConfigured(f'SHARDQ["QUEUES"] cannot be read: {exc}') from exc


def limit_report(using: str = "default") -> list[dict[str, Any]]:
    """Every limit in use or waited on, for ``shardq_status`` and the admin:
    key, what it is, capacity (from this process's tasks and settings; None
    when it does not know the limit), slots in use, holders (worker -> slots),
    waiting READY jobs, and a rate limit's tokens available now."""
    from .core.limits import grant
    from .db import operations
    from .tasks import resolve

    queues = queue_limits()

    def find(path: str) -> Task | None:
        try:
            return resolve(path)
        except Exception:  # an unknown or broken task: its capacity is unknown
            return None

    report = []
    for key, in_use, holders, waiting, tat, now, by_shard_key in operations.run("limit_usage", using=using):
        spec = spec_for_key(key, find, queues)
        if key.startswith(QUEUE_PREFIX):
            kind = "queue"
        elif by_shard_key:
            # Kept by the key's owner in its local queue (no slots): in use
            # are the key's running jobs, held by the workers running them.
            kind = "partition by shard key"
        elif is_partition_key(key):
            kind = "partition"
        else:
            kind = "task"
        tokens = None
        if spec is not None and spec.rate is not None:
            tokens = grant(tat if tat is not None else now, now, spec.rate, spec.rate.burst)[0]
        report.append(
            {
                "key": key,
                "kind": kind,
                "max_concurrency": None if spec is None else spec.max_concurrency,
                "rate_limit": None
                if spec is None or spec.rate is None
                else f"{spec.rate.count}/{_UNITS[spec.rate.period]}",
                "burst": None if spec is None or spec.rate is None else spec.rate.burst,
                "in_use": in_use,
                "holders": holders if isinstance(holders, dict) else json.loads(holders),
                "waiting": waiting,
                "tokens_now": tokens,
            }
        )
    return report
