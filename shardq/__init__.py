"""shardq: a sharded, fenced Django Tasks backend on PostgreSQL.

The public names load lazily, so ``shardq.core`` (pure Python) can be
imported without Django.
"""

from importlib import import_module

__all__ = [
    "Backoff",
    "Cancelled",
    "DatabaseUnavailable",
    "DuplicateStep",
    "DurableNeedsSyncTask",
    "FenceLost",
    "ParentFailed",
    "RankedModel",
    "ShardTask",
    "ShardqError",
    "SignalRefused",
    "SignalTimeout",
    "TaskTimeout",
    "UnknownTask",
    "WorkerLost",
    "Workflow",
    "WorkflowError",
    "advance",
    "cancel",
    "complete_in_transaction",
    "enqueue_many",
    "exponential",
    "fenced",
    "jobs",
    "periodic",
    "shard_task",
    "signal",
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
    "Cancelled": "shardq.exceptions",
    "TaskTimeout": "shardq.exceptions",
    "SignalTimeout": "shardq.exceptions",
    "SignalRefused": "shardq.exceptions",
    "DuplicateStep": "shardq.exceptions",
    "DurableNeedsSyncTask": "shardq.exceptions",
    "signal": "shardq.durable",
    "complete_in_transaction": "shardq.completion",
    "fenced": "shardq.completion",
    "periodic": "shardq.cron",
    "jobs": "shardq.search",
    "Workflow": "shardq.workflows",
    "WorkflowError": "shardq.exceptions",
    "ParentFailed": "shardq.exceptions",
    "advance": "shardq.ranks",
    "RankedModel": "shardq.ranks",
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


def cancel(*results, reason: str = "") -> list[str]:
    """Cancel jobs that have not finished; returns the ids it cancelled.

    ``results`` are ``TaskResult``s or their ids. A READY job (deferred or
    waiting) will not run. A RUNNING attempt is told, cooperatively: its
    worker learns it from a NOTIFY (or at its next heartbeat), a sync task
    with ``takes_context`` sees ``context.is_cancelled()`` turn True and an
    async task gets ``CancelledError`` at its next ``await``. A task that
    ignores it runs to its end, but its outcome is refused, and a task that
    completes in its own transaction (``complete_in_transaction``) rolls its
    writes back. Either way the job ends FAILED with a
    ``shardq.exceptions.Cancelled`` error (with ``reason``). Jobs already
    finished, or not found, are left as they are. Runs on the caller's
    connection: inside ``transaction.atomic()`` the cancel happens at commit.
    """
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, TaskResult, task_backends

    by_backend: dict[str, list] = {}
    for result in results:
        if isinstance(result, TaskResult):
            by_backend.setdefault(result.backend, []).append(result.id)
        else:
            by_backend.setdefault(DEFAULT_TASK_BACKEND_ALIAS, []).append(result)
    cancelled = []
    for alias, ids in by_backend.items():
        backend = task_backends[alias]
        if not hasattr(backend, "cancel"):
            raise TypeError(
                f"backend {alias!r} ({type(backend).__name__}) is not shardq's: "
                "cancel needs shardq.backend.ShardqBackend."
            )
        cancelled += backend.cancel(ids, reason=reason)
    return cancelled
