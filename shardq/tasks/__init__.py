"""shardq's tasks: ``definition`` (``@shard_task`` and ``ShardTask``, options
validated at definition), ``keys`` (shard keys, argument binding), ``unique``
(unique keys) and ``registry`` (how a worker resolves a row's task path). Redaction of
sensitive arguments is the admin's (``shardq.admin.redaction``)."""

from .definition import (
    SALT_MAX,
    UNIQUE_FOR_MAX_SECONDS,
    Backoff,
    ShardTask,
    exponential,
    shard_task,
    validate_shard_options,
)
from .keys import (
    bind_arguments,
    check_text,
    compute_shard_key,
    key_to_str,
)
from .registry import (
    autodiscover,
    discover,
    register,
    registered_task_paths,
    resolve,
)
from .unique import HASHED_UNIQUE_KEY_MARK, UNIQUE_KEY_MAX_BYTES, compute_unique_key

__all__ = [
    "HASHED_UNIQUE_KEY_MARK",
    "SALT_MAX",
    "UNIQUE_FOR_MAX_SECONDS",
    "UNIQUE_KEY_MAX_BYTES",
    "Backoff",
    "ShardTask",
    "autodiscover",
    "bind_arguments",
    "check_text",
    "compute_shard_key",
    "compute_unique_key",
    "discover",
    "exponential",
    "key_to_str",
    "register",
    "registered_task_paths",
    "resolve",
    "shard_task",
    "validate_shard_options",
]
