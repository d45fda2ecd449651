"""``@shard_task`` and its Task subclass, plus the registry the worker resolves
task paths through (a worker never imports an arbitrary callable named in a row).
"""

import hashlib
import inspect
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from importlib import import_module
from typing import Any

from django.apps import apps
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, Task
from django.tasks.base import DEFAULT_TASK_PRIORITY
from django.tasks.exceptions import InvalidTask

from .core.limits import LimitError, check_concurrency, parse_rate
from .exceptions import ArgumentNotJSON, UnknownTask


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

    @property
    def unique_for_seconds(self) -> float | None:
        """``unique_for`` in seconds (None: the task is not unique)."""
        if self.unique_for is None:
            return None
        if isinstance(self.unique_for, timedelta):
            return self.unique_for.total_seconds()
        return float(self.unique_for)

    def using(self, *, shard_key=None, **changes):
        task = Task.using(self, **changes)
        if shard_key is not None:
            task = replace(task, shard_key=key_to_str(shard_key, "shard_key"))
        return task


def key_to_str(value: Any, what: str = "shard_key") -> str:
    """A shard key as the text shardq stores and hashes (raises InvalidTask).

    ``what`` names where the key came from in the message."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int):
        text = str(value)
    else:
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ArgumentNotJSON(
                f"The shard key {what} = {_short_repr(value)} is not JSON ({exc}): use a str, int "
                "or JSON value as the key."
            ) from exc
    check_text(text, f"The shard key {what}")
    return text


def check_text(text: str, what: str) -> None:
    """Refuse text PostgreSQL cannot store (raises InvalidTask naming ``what``):
    a NUL character, or a lone surrogate (no UTF-8 form; hashing or sending
    it would fail, and mmh3 would crash the process)."""
    if "\x00" in text:
        raise InvalidTask(
            f"{what} holds a NUL character (\\x00), which PostgreSQL cannot store in text or "
            "jsonb. Remove it (or encode the value, e.g. as base64) before enqueueing."
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidTask(
                f"{what} holds a lone surrogate ({text[exc.start]!r} at index {exc.start}), which "
                "is not valid Unicode and cannot be stored: it usually comes from a JSON body with "
                "an unpaired \\uXXXX escape. Refuse or repair the value before enqueueing (e.g. "
                "value.encode('utf-8', 'replace').decode())."
            ) from None


def _short_repr(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    max_concurrency=None,
    rate_limit=None,
    limit_by=None,
):
    """Decorate a module-level function as a shardq task (see ``ShardTask``)."""
    if isinstance(sensitive, (list, set, frozenset)):
        sensitive = tuple(sensitive)

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
            unique_for=unique_for,
            unique_key=unique_key,
            sensitive=sensitive,
            salt=salt,
            on_worker_lost=on_worker_lost,
            max_concurrency=max_concurrency,
            rate_limit=rate_limit,
            limit_by=limit_by,
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
    if task.on_worker_lost not in ("retry", "fail"):
        raise InvalidTask(
            f"{name}: on_worker_lost must be 'retry' (run again, at-least-once) or 'fail' "
            f"(at-most-once), not {task.on_worker_lost!r}."
        )


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


REDACTED = "[redacted]"


def _sensitive_names(task: Task) -> frozenset | bool:
    """True (every argument), or the names marked sensitive (maybe none)."""
    value = getattr(task, "sensitive", ())
    if value is True:
        return True
    return frozenset(value or ())


def redact_arguments(task: Task | None, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """A job's stored ``args`` and ``kwargs`` as an operator may see them.

    The values of the arguments ``task`` marks sensitive become
    ``"[redacted]"``; positional ones are named through the function's
    signature (the context parameter of ``takes_context`` tasks is not
    stored), extra positional or keyword values through the ``*args`` /
    ``**kwargs`` parameter's name. ``task=None`` (a task path this process
    cannot resolve: its sensitivity is unknown) redacts every value, as does
    a stored shape that does not fit the function.
    """
    names = True if task is None else _sensitive_names(task)
    if names is True:
        return (
            [REDACTED] * len(args) if isinstance(args, list) else REDACTED,
            {k: REDACTED for k in kwargs} if isinstance(kwargs, dict) else REDACTED,
        )
    if not names:
        return args, kwargs
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return REDACTED, REDACTED
    params = list(_signature(task).parameters.values())
    if task is not None and task.takes_context and params:  # not None: names would be True
        params = params[1:]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    var_keyword = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    shown_args = []
    for i, value in enumerate(args):
        # An extra positional value with no *args to take it does not fit the
        # function: hidden rather than guessed at.
        arg = positional[i] if i < len(positional) else var_positional
        shown_args.append(REDACTED if arg is None or arg in names else value)
    shown_kwargs = {
        k: REDACTED if (k in names or (k not in keyword and (var_keyword is None or var_keyword in names))) else v
        for k, v in kwargs.items()
    }
    return shown_args, shown_kwargs


def shard_key_is_sensitive(task: Task | None) -> bool:
    """Whether a job's stored shard key may reveal a sensitive argument: the
    task marks every argument sensitive, its ``key`` names a sensitive
    argument, or ``key`` is a callable (it may read any argument) and some
    argument is sensitive. Unknown tasks (None): yes."""
    if task is None:
        return True
    names = _sensitive_names(task)
    if not names:
        return False
    key = getattr(task, "key", None)
    if names is True:
        return True
    return callable(key) or key in names


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
        return key_to_str(task.key(args, kwargs), f"returned by key={_callable_name(task.key)}")
    what = f"(argument {task.key!r})"
    if task.key in kwargs:
        return key_to_str(kwargs[task.key], what)
    return key_to_str(_bind(task, args, kwargs, apply_defaults=True)[task.key], what)


def _callable_name(func) -> str:
    return getattr(func, "__qualname__", None) or type(func).__name__


def bind_arguments(task: Task, args: tuple, kwargs: dict) -> None:
    """Refuse a call that does not fit the task function's signature (a wrong
    number of arguments, an unknown or repeated keyword) with InvalidTask, at
    enqueue, instead of a TypeError in the worker that spends the job's
    attempts. Every kind of task: plain ``@task`` ones too."""
    shape = _shapes.get(task.func)
    if shape is None:
        shape = _shapes[task.func] = _Shape.of(_signature(task))
    if not shape.fits(len(args) + (1 if task.takes_context else 0), kwargs):
        _bind(task, args, kwargs, apply_defaults=False)  # raises with Python's own words


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a call must look like to bind to a signature without positional-only
    parameters, checked with set operations (Signature.bind costs more than
    the rest of job_row); anything else is left to Signature.bind."""

    simple: bool
    positional: tuple = ()
    positional_set: frozenset = frozenset()
    required_positional: tuple = ()
    keyword_only: frozenset = frozenset()
    required_keyword_only: frozenset = frozenset()
    var_positional: bool = False
    var_keyword: bool = False

    @classmethod
    def of(cls, sig: inspect.Signature) -> "_Shape":
        params = list(sig.parameters.values())
        if any(p.kind is p.POSITIONAL_ONLY for p in params):
            return cls(simple=False)
        positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        return cls(
            simple=True,
            positional=positional,
            positional_set=frozenset(positional),
            required_positional=tuple(
                p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
            ),
            keyword_only=frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY),
            required_keyword_only=frozenset(
                p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty
            ),
            var_positional=any(p.kind is p.VAR_POSITIONAL for p in params),
            var_keyword=any(p.kind is p.VAR_KEYWORD for p in params),
        )

    def fits(self, count: int, kwargs: dict) -> bool:
        """Whether ``count`` positional values and ``kwargs`` bind (False: maybe not)."""
        if not self.simple:
            return False
        if count > len(self.positional) and not self.var_positional:
            return False
        taken = self.positional[:count]
        for name in kwargs:
            if name in taken:
                return False
            if not self.var_keyword and name not in self.positional_set and name not in self.keyword_only:
                return False
        for name in self.required_positional:
            if name not in kwargs and name not in taken:
                return False
        return all(name in kwargs for name in self.required_keyword_only)


_shapes: dict[Callable, _Shape] = {}


# A unique key longer than this (bytes of UTF-8) keeps its task path and
# stores a SHA-256 of the rest: the key is a btree primary key (PostgreSQL
# refuses index entries over ~2.7 kB) and arguments may be up to a MiB.
UNIQUE_KEY_MAX_BYTES = 512
# What follows the task path in a hashed unique key (a raw key has ":" there).
# Keys hashed before this mark was introduced ("<path>:sha256:<hex>") stay
# in shardq_unique until they expire and are then pruned as usual.
HASHED_UNIQUE_KEY_MARK = "#sha256:"


def compute_unique_key(task: "ShardTask", args: tuple, kwargs: dict) -> str:
    """The unique key of one call of a unique task, always prefixed with the task path.

    * ``unique_key=None``: every argument as passed, positional ones named by
      the function's signature (``f(1)`` and ``f(a=1)`` are the same call),
      as canonical JSON (sorted keys, compact). Defaults the caller left out
      are not filled in.
    * ``unique_key="name"``: that argument's value (a str as is, anything
      else as canonical JSON), passed positionally, by keyword or defaulted.
    * ``unique_key=callable``: ``callable(args, kwargs)``, turned into text
      the same way.
    """
    spec = task.unique_key
    if spec is None:
        body = _canonical_json(task, _bind(task, args, kwargs, apply_defaults=False))
    elif callable(spec):
        body = _unique_text(task, spec(args, kwargs))
    elif spec in kwargs:
        body = _unique_text(task, kwargs[spec])
    else:
        body = _unique_text(task, _bind(task, args, kwargs, apply_defaults=True)[spec])
    key = f"{task.module_path}:{body}"
    try:
        size = len(key.encode())
    except UnicodeEncodeError:  # a lone surrogate: PostgreSQL text cannot hold it
        size = None
    if size is None or size > UNIQUE_KEY_MAX_BYTES or "\x00" in key:
        # The hashed form puts "#" right after the task path, the raw form
        # ":": a task path (a dotted Python name) holds neither, so no raw
        # value -- not even "sha256:<hex>" -- can equal a hashed key.
        digest = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()
        key = f"{task.module_path}{HASHED_UNIQUE_KEY_MARK}{digest}"
    return key


def _signature(task: Task) -> inspect.Signature:
    sig = _signatures.get(task.func)
    if sig is None:
        sig = _signatures[task.func] = inspect.signature(task.func)
    return sig


def _bind(task: Task, args: tuple, kwargs: dict, *, apply_defaults: bool) -> dict:
    sig = _signature(task)
    call_args = (None, *args) if task.takes_context else args
    try:
        bound = sig.bind(*call_args, **kwargs)
    except TypeError as exc:
        raise InvalidTask(
            f"{task.module_path}: the arguments do not match {task.func.__name__}{sig}: {exc}. "
            "Pass the arguments the function takes."
        ) from exc
    if apply_defaults:
        bound.apply_defaults()
    arguments = dict(bound.arguments)
    if task.takes_context:
        arguments.pop("context", None)
    return arguments


def _canonical_json(task: Task, value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTask(
            f"{task.module_path}: the unique key {value!r} is not JSON: make unique_key name a "
            "JSON argument or return a str, int or JSON value."
        ) from exc


def _unique_text(task: Task, value: Any) -> str:
    if isinstance(value, str):
        return value
    return _canonical_json(task, value)


# Tasks register themselves when they are defined (validate_task runs in
# Task.__post_init__); the worker resolves task paths here only.
_registry: dict[str, Task] = {}


def register(task: Task) -> None:
    _registry.setdefault(task.module_path, task)


def registered_task_paths() -> list[str]:
    """The task paths defined (imported) in this process so far."""
    return list(_registry)


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
    if not module_name or not any(module_name == root or module_name.startswith(root + ".") for root in allowed):
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
            f"{task_path!r} is a {type(obj).__name__}, not a Task: decorate it with @task or @shard_task."
        )
    _registry.setdefault(task_path, obj)
    return obj


def autodiscover(extra_modules: tuple = ()) -> None:
    """Import every installed app's ``tasks`` module and the extra modules."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for name in extra_modules:
        import_module(name)
