"""Tasks of the failure-domain tests (tests/isolation/): each misbehaves in one
way a real task can, and must cost only its own job."""

import asyncio
import time

from django.tasks import task

from shardq import shard_task

from .fault_tasks import log_execution


@shard_task(takes_context=True)
def started(context, n: int = 0, sleep: float = 0.0) -> int:
    """A healthy job with default options: logs each real start, then returns n."""
    log_execution(context)
    if sleep:
        time.sleep(sleep)
    return n


@task()
def plain(n: int = 0) -> int:
    """A plain Django task (default max_attempts)."""
    return n


@shard_task()
def returns(kind: str):
    """Return a value PostgreSQL's jsonb cannot store, or one over MAX_RESULT_BYTES."""
    return {
        "nul": "a\u0000b",
        "surrogate": ["ok", {"k": "\ud800"}],
        "huge": "x" * (2 * 1024 * 1024),
    }[kind]


@shard_task()
def raises(kind: str) -> None:
    """Raise an error whose message jsonb refuses, or a BaseException."""
    if kind == "nul":
        raise ValueError("bad \u0000 message")
    if kind == "surrogate":
        raise ValueError("bad \udc80 message")
    if kind == "keyboard":
        raise KeyboardInterrupt("pressed inside a task")
    if kind == "cancelled":

        async def cancelled():
            raise asyncio.CancelledError()

        asyncio.run(cancelled())
    if kind == "exit":
        raise SystemExit(3)


@shard_task(takes_context=True)
def with_context(context) -> int:
    """Reads its context (the TaskResult is built from the row's errors)."""
    return context.attempt
