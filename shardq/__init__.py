"""shardq: a sharded, fenced Django Tasks backend on PostgreSQL."""

from .exceptions import DatabaseUnavailable, ShardqError, UnknownTask, WorkerLost
from .tasks import Backoff, ShardTask, exponential, shard_task

__all__ = [
    "Backoff",
    "DatabaseUnavailable",
    "ShardTask",
    "ShardqError",
    "UnknownTask",
    "WorkerLost",
    "enqueue_many",
    "exponential",
    "shard_task",
]


def enqueue_many(task, calls):
    """Enqueue many calls of ``task`` in one statement.

    ``calls`` is an iterable of ``(args, kwargs)`` pairs. Every call is
    validated first; one bad call raises ``InvalidTask`` and stores nothing.
    Runs on the caller's connection, so inside ``transaction.atomic()`` the
    jobs exist only if the caller commits. Returns one ``TaskResult`` a call.
    """
    return task.get_backend().enqueue_many(task, calls)
