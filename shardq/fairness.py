"""Fair share inside a queue: which fair key a job counts against, and what
each key weighs (docs/fairness.md).

At enqueue, ``call_fair_key`` names the fair key of one call (stored in
``shardq_job.fair_key``; None for the common job, which behaves and costs
exactly as before). In the worker, ``FairWeights`` turns a key into its
weight (the job's own ``fair_weight``, else ``SHARDQ["FAIRNESS"]["WEIGHTS"]``,
else 1) and ``FairBy`` tells whether a task's share counts starts or
measured worker time. The shares themselves are kept by the claim
(shardq/db/sql/job.sql, ``claim_fair``) and the local queue
(shardq/core/localqueue.py).
"""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task
from django.tasks.exceptions import InvalidTask

from .tasks import ShardTask, key_to_str
from .tasks.definition import fair_key_text
from .tasks.keys import _bind, _short_repr

#: The weight of a key the settings do not name.
DEFAULT_WEIGHT = 1.0


def queue_fair_keys() -> dict[str, str]:
    """``SHARDQ["QUEUES"][name]["fair_key"]`` for each queue that sets one:
    the argument name its tasks' jobs are shared by (raises ImproperlyConfigured)."""
    raw = getattr(settings, "SHARDQ", {}).get("QUEUES")
    if not isinstance(raw, dict):
        return {}
    keys = {}
    for queue, options in raw.items():
        if not isinstance(options, dict) or options.get("fair_key") is None:
            continue
        name = options["fair_key"]
        if not isinstance(name, str) or not name.isidentifier():
            raise ImproperlyConfigured(
                f'SHARDQ["QUEUES"][{queue!r}]["fair_key"] must name an argument of the queue\'s tasks '
                f'(e.g. "tenant_id"), not {name!r}.'
            )
        keys[queue] = name
    return keys


def call_fair_key(task: Task, args: tuple, kwargs: dict, queue_keys: Mapping[str, str]) -> str | None:
    """The fair key of one call (stored text; None: no fair key).

    ``.using(fair_key=...)`` wins, then the task's ``fair_key``, then its
    queue's default (an argument the task does not have: no fair key)."""
    value = getattr(task, "fair_key_value", None)
    if value is not None:
        return str(value)
    by = getattr(task, "fair_key", None)
    if by is None:
        name = queue_keys.get(task.queue_name)
        if name is None:
            return None
        bound = _bind(task, args, kwargs, apply_defaults=True)
        if name not in bound:
            return None
        return _text(task, bound[name], f"(argument {name!r} of the queue's fair_key)")
    if callable(by):
        return _text(task, by(args, kwargs), f"returned by fair_key={getattr(by, '__qualname__', type(by).__name__)}")
    if by in kwargs:
        return _text(task, kwargs[by], f"(argument {by!r} of fair_key)")
    return _text(task, _bind(task, args, kwargs, apply_defaults=True)[by], f"(argument {by!r} of fair_key)")


def _text(task: Task, value: Any, what: str) -> str:
    try:
        text = key_to_str(value, what)
    except InvalidTask as exc:
        raise InvalidTask(
            f"{task.module_path}: the fair key {what} = {_short_repr(value)} cannot be a fair key "
            f"(a str, int or JSON value without NUL characters). ({exc})"
        ) from None
    return fair_key_text(text)


def configured_weights() -> Callable[[str], float]:
    """``SHARDQ["FAIRNESS"]["WEIGHTS"]`` as key -> weight (default 1): a
    mapping is checked now, a callable on each call (a bad answer counts 1,
    logged by the caller's check)."""
    raw = getattr(settings, "SHARDQ", {}).get("FAIRNESS") or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f'SHARDQ["FAIRNESS"] must be a dict like {{"WEIGHTS": {{"acme": 3}}}}, not {raw!r}.')
    unknown = set(raw) - {"WEIGHTS"}
    if unknown:
        raise ImproperlyConfigured(
            f'SHARDQ["FAIRNESS"] has unknown option(s) {", ".join(sorted(map(repr, unknown)))}: it takes WEIGHTS.'
        )
    weights = raw.get("WEIGHTS")
    if weights is None:
        return _one
    if callable(weights):
        return _checked(weights)
    if not isinstance(weights, Mapping):
        raise ImproperlyConfigured(
            'SHARDQ["FAIRNESS"]["WEIGHTS"] must be a mapping of fair key -> weight, or a callable '
            f"taking a fair key and returning its weight, not {weights!r}."
        )
    table: dict[str, float] = {}
    for key, weight in weights.items():
        table[key_to_str(key, "a key of SHARDQ['FAIRNESS']['WEIGHTS']")] = check_weight(
            weight, f'SHARDQ["FAIRNESS"]["WEIGHTS"][{key!r}]'
        )
    return lambda key: table.get(key, DEFAULT_WEIGHT)


def check_weight(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ImproperlyConfigured(f"{what} = {value!r}: a weight is a positive number (default 1).")
    return float(value)


def _one(key: str) -> float:
    return DEFAULT_WEIGHT


def _checked(weights: Callable[[str], Any]) -> Callable[[str], float]:
    def weight(key: str) -> float:
        try:
            return check_weight(weights(key), 'SHARDQ["FAIRNESS"]["WEIGHTS"](key)')
        except Exception:  # a weight function's bug must not stop the worker: weight 1
            return DEFAULT_WEIGHT

    return weight


class FairWeights:
    """fair key -> weight in the worker, remembered (at most ``size`` keys:
    a callable in settings may be costly, and rows can name any key)."""

    def __init__(self, weights: Callable[[str], float] | None = None, size: int = 65536) -> None:
        self._weights = weights or configured_weights()
        self._size = size
        self._known: dict[str, float] = {}

    def __call__(self, key: str) -> float:
        weight = self._known.get(key)
        if weight is None:
            weight = self._weights(key)
            if len(self._known) >= self._size:
                self._known.clear()
            self._known[key] = weight
        return weight


class FairBy:
    """task path -> is its share counted in worker time (``fair_by="time"``)?
    Remembered per path, at most ``size`` (a row can name any path)."""

    def __init__(self, resolve: Callable[[str], Task | None], size: int = 1024) -> None:
        self._resolve = resolve
        self._size = size
        self._by_time: dict[str, bool] = {}

    def __call__(self, path: str) -> bool:
        known = self._by_time.get(path)
        if known is not None:
            return known
        try:
            task = self._resolve(path)
        except Exception:  # an unknown task: counted by starts (it fails anyway)
            task = None
        by_time = isinstance(task, ShardTask) and task.fair_by == "time"
        if len(self._by_time) >= self._size:
            self._by_time.clear()
        self._by_time[path] = by_time
        return by_time


#: Fair keys shown by name per queue (shardq_status, the metrics); the rest are "other".
TOP_KEYS = 5
OTHER = "other"


def fair_key_report(using: str = "default", top: int = TOP_KEYS) -> list[dict[str, Any]]:
    """Per queue, its top fair keys (by jobs waiting, then starts over the
    last minute) and the rest as "other": jobs waiting, oldest due wait
    (seconds), share of starts and of worker time over the last minute. For
    ``shardq_status`` and the admin's dashboard (docs/fairness.md,
    "Operator's view"); the metrics summarize the same rows
    (``summarize_fair_keys``)."""
    from .db import operations

    return summarize_fair_keys(operations.run("status_fair_keys", using=using), top)


def summarize_fair_keys(rows: Iterable[Sequence[Any]], top: int = TOP_KEYS) -> list[dict[str, Any]]:
    """``status_fair_keys`` rows (queue, key, backlog, oldest seconds,
    starts, seconds) -> ``fair_key_report``'s shape."""
    by_queue: dict[str, list[tuple]] = {}
    for row in rows:
        by_queue.setdefault(row[0], []).append(tuple(row[1:]))
    report = []
    for queue, keyed in sorted(by_queue.items()):
        keyed.sort(key=lambda r: (-r[1], -r[3], r[0]))
        shown, rest = keyed[:top], keyed[top:]
        if rest:
            oldest = [r[2] for r in rest if r[2] is not None]
            shown.append(
                (
                    OTHER,
                    sum(r[1] for r in rest),
                    max(oldest) if oldest else None,
                    sum(r[3] for r in rest),
                    sum(r[4] for r in rest),
                )
            )
        starts = sum(r[3] for r in keyed) or 1
        seconds = sum(r[4] for r in keyed) or 1.0
        report.append(
            {
                "queue": queue,
                "keys": [
                    {
                        "key": key,
                        "backlog": backlog,
                        "oldest_seconds": None if oldest is None else round(oldest, 1),
                        "starts_share": round(n / starts, 3),
                        "time_share": round(s / seconds, 3),
                    }
                    for key, backlog, oldest, n, s in shown
                ],
            }
        )
    return report
