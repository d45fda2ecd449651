"""Keys: the text of a shard key and the binding of a call to its function's
signature (unique keys, what "the same job" means, are ``unique.py``'s)."""

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.tasks import Task
from django.tasks.exceptions import InvalidTask

from ..exceptions import ArgumentNotJSON


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


def compute_shard_key(task: Task, args: tuple, kwargs: dict) -> str | None:
    """The shard key of one call, or None (no key: spread over all shards).

    A plain Django ``Task`` has neither ``shard_key`` nor ``key``: no key."""
    shard_key = getattr(task, "shard_key", None)
    if shard_key is not None:
        return shard_key
    key = getattr(task, "key", None)
    if key is None:
        return None
    if callable(key):
        return key_to_str(key(args, kwargs), f"returned by key={_callable_name(key)}")
    what = f"(argument {key!r})"
    if key in kwargs:
        return key_to_str(kwargs[key], what)
    return key_to_str(_bind(task, args, kwargs, apply_defaults=True)[key], what)


def _callable_name(func) -> str:
    return getattr(func, "__qualname__", None) or type(func).__name__


def bind_arguments(task: Task, args: tuple, kwargs: dict) -> None:
    """Refuse a call that does not fit the task function's signature (a wrong
    number of arguments, an unknown or repeated keyword) with InvalidTask, at
    enqueue, instead of a TypeError in the worker that spends the job's
    attempts. Every kind of task: plain ``@task`` ones too."""
    shape = _shapes.get(task.func)
    if shape is None:
        shape = _shapes[task.func] = _Shape.of(signature_of(task))
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


_signatures: dict[Callable, inspect.Signature] = {}


def signature_of(task: Task) -> inspect.Signature:
    sig = _signatures.get(task.func)
    if sig is None:
        sig = _signatures[task.func] = inspect.signature(task.func)
    return sig


def _bind(task: Task, args: tuple, kwargs: dict, *, apply_defaults: bool) -> dict:
    sig = signature_of(task)
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
