"""shardq: a sharded, fenced Django Tasks backend on PostgreSQL.

The public names load lazily, so ``shardq.core`` (pure Python) can be
imported without Django.
"""

from importlib import import_module

__all__ = [
    "Backoff",
    "DatabaseUnavailable",
    "FenceLost",
    "ShardTask",
    "ShardqError",
    "UnknownTask",
    "WorkerLost",
    "complete_in_transaction",
    "enqueue_many",
    "exponential",
    "fenced",
    "periodic",
    "shard_task",
]

_LAZY = {
    "Backoff": "shardq.tasks",
    "ShardTask": "shardq.tasks",
    "exponential": "shardq.tasks",
    "shard_task": "shardq.tasks",
    "DatabaseUnavailable": "shardq.exceptions",
    "ShardqError": "shardq.exceptions",
    "UnknownTask": "shardq.exceptions",
    "WorkerLost": "shardq.exceptions",
    "FenceLost": "shardq.exceptions",
    "complete_in_transaction": "shardq.completion",
    "fenced": "shardq.completion",
    "periodic": "shardq.cron",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardq' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def enqueue_many(task, calls):
    """Enqueue many calls of ``task`` in one statement.

    ``calls`` is an iterable of ``(args, kwargs)`` pairs. Every call is
    validated first; one bad call raises ``InvalidTask`` and stores nothing.
    Runs on the caller's connection, so inside ``transaction.atomic()`` the
    jobs exist only if the caller commits. Returns one ``TaskResult`` a call.
    """
    backend = task.get_backend()
    if not hasattr(backend, "enqueue_many"):
        raise TypeError(
            f"{task.module_path} uses backend {task.backend!r} ({type(backend).__name__}), "
            "which is not shardq's: enqueue_many needs shardq.backend.ShardqBackend."
        )
    return backend.enqueue_many(task, calls)
