"""Unique keys: what "the same job" means for a task defined with
``unique_for`` (``ShardTask.unique_key``)."""

import hashlib
import json
from typing import Any

from django.tasks import Task
from django.tasks.exceptions import InvalidTask

from .definition import ShardTask
from .keys import _bind

# A unique key longer than this (bytes of UTF-8) keeps its task path and
# stores a SHA-256 of the rest: the key is a btree primary key (PostgreSQL
# refuses index entries over ~2.7 kB) and arguments may be up to a MiB.
UNIQUE_KEY_MAX_BYTES = 512
# What follows the task path in a hashed unique key (a raw key has ":" there).
# Keys hashed before this mark was introduced ("<path>:sha256:<hex>") stay
# in shardq_unique until they expire and are then pruned as usual.
HASHED_UNIQUE_KEY_MARK = "#sha256:"


def compute_unique_key(task: ShardTask, args: tuple, kwargs: dict) -> str:
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
