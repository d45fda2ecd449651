"""``@shard_task`` and its Task subclass, plus the registry the worker resolves
task paths through (a worker never imports an arbitrary callable named in a row).
"""

import inspect
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module
from typing import Any

from django.apps import apps
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, Task
from django.tasks.base import DEFAULT_TASK_PRIORITY
from django.tasks.exceptions import InvalidTask

from .exceptions import UnknownTask


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``min(cap, base ** n)`` seconds,
    times a random factor in ``[1 - jitter, 1]`` so retries do not stampede."""

    base: float = 2.0
    cap: float = 600.0
    jitter: float = 0.25

    def delay(self, attempt: int) -> float:
        raw = min(self.cap, self.base**attempt)
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
    """

    key: str | Callable[[tuple, dict], Any] | None = None
    shard_key: str | None = None
    max_attempts: int = 1
    backoff: Backoff | None = None
    ordered: bool = False

    def using(self, *, shard_key=None, **changes):
        task = Task.using(self, **changes)
        if shard_key is not None:
            task = replace(task, shard_key=key_to_str(shard_key))
        return task


def key_to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidTask(
            f"The shard key {value!r} is not JSON: use a str, int or JSON value as the key."
        ) from exc


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
):
    """Decorate a module-level function as a shardq task (see ``ShardTask``)."""

    def wrapper(func):
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
            params = inspect.signature(task.func).parameters
            if task.key not in params or (task.takes_context and task.key == "context"):
                raise InvalidTask(
                    f"{name}: key={task.key!r} is not an argument of the function "
                    f"(its arguments: {', '.join(params) or 'none'}). Name one of them, "
                    "or pass a callable key=lambda args, kwargs: ..."
                )
        elif not callable(task.key):
            raise InvalidTask(f"{name}: key must be an argument name or a callable, not {task.key!r}.")
    if not isinstance(task.max_attempts, int) or isinstance(task.max_attempts, bool) or task.max_attempts < 1:
        raise InvalidTask(f"{name}: max_attempts must be an int >= 1, not {task.max_attempts!r}.")
    if task.backoff is not None and not isinstance(task.backoff, Backoff):
        raise InvalidTask(f"{name}: backoff must come from shardq.exponential(...), not {task.backoff!r}.")


_signatures: dict[Callable, inspect.Signature] = {}


def compute_shard_key(task: Task, args: tuple, kwargs: dict) -> str | None:
    """The shard key of one call, or None (no key: spread over all shards)."""
    if not isinstance(task, ShardTask):
        return None
    if task.shard_key is not None:
        return task.shard_key
    if task.key is None:
        return None
    if callable(task.key):
        return key_to_str(task.key(args, kwargs))
    if task.key in kwargs:
        return key_to_str(kwargs[task.key])
    sig = _signatures.get(task.func)
    if sig is None:
        sig = _signatures[task.func] = inspect.signature(task.func)
    call_args = (None, *args) if task.takes_context else args
    try:
        bound = sig.bind(*call_args, **kwargs)
    except TypeError as exc:
        raise InvalidTask(f"{task.module_path}: arguments do not match the function: {exc}") from exc
    bound.apply_defaults()
    return key_to_str(bound.arguments[task.key])


# Tasks register themselves when they are defined (validate_task runs in
# Task.__post_init__); the worker resolves task paths here only.
_registry: dict[str, Task] = {}


def register(task: Task) -> None:
    _registry.setdefault(task.module_path, task)


def resolve(task_path: str, extra_modules: tuple = ()) -> Task:
    """The Task a job's ``task_path`` names.

    Looks in the registry; failing that, imports the path's module only when
    it belongs to an installed app or to ``SHARDQ["TASK_MODULES"]`` and the
    attribute is a Task instance. Nothing else is ever imported or called.
    """
    task = _registry.get(task_path)
    if task is not None:
        return task
    module_name, _, attr = task_path.rpartition(".")
    allowed = [cfg.name for cfg in apps.get_app_configs()] + list(extra_modules)
    if not module_name or not any(
        module_name == root or module_name.startswith(root + ".") for root in allowed
    ):
        raise UnknownTask(
            f"No task {task_path!r} is registered and its module is not part of an installed "
            "app: define the task in an installed app (or list its module in "
            "SHARDQ['TASK_MODULES'])."
        )
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise UnknownTask(f"Task {task_path!r} cannot be imported: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise UnknownTask(f"Task {task_path!r} does not exist: {module_name} has no {attr!r}.")
    if not isinstance(obj, Task):
        raise UnknownTask(
            f"{task_path!r} is a {type(obj).__name__}, not a Task: decorate it with "
            "@task or @shard_task."
        )
    _registry.setdefault(task_path, obj)
    return obj


def autodiscover(extra_modules: tuple = ()) -> None:
    """Import every installed app's ``tasks`` module and the extra modules."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for name in extra_modules:
        import_module(name)
