"""Limited tasks (docs/limits.md) for tests/acceptance/test_limits.py and the
bench's limits phase. Each run appends ``start``/``end`` lines (job id,
wall-clock time, pid, partition) to the file $SHARDQ_LIMIT_LEDGER: one
O_APPEND write per line, atomic between processes on one machine."""

import os
import time

from django.tasks import TaskContext

from shardq import exponential, shard_task


def _log(event: str, context: TaskContext, part: str = "") -> None:
    path = os.environ.get("SHARDQ_LIMIT_LEDGER")
    if not path:
        return
    line = f"{event} {context.task_result.id} {time.time():.6f} {os.getpid()} {part}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _run(context: TaskContext, sleep: float, part: str = "") -> None:
    _log("start", context, part)
    try:
        time.sleep(sleep)
    finally:
        _log("end", context, part)


@shard_task(takes_context=True, max_concurrency=3)
def three_at_once(context: TaskContext, n: int = 0, sleep: float = 0.2) -> int:
    _run(context, sleep)
    return n


@shard_task(takes_context=True, rate_limit="20/s")
def twenty_a_second(context: TaskContext, n: int = 0, sleep: float = 0.2) -> int:
    _run(context, sleep)
    return n


@shard_task(takes_context=True, max_concurrency=2, limit_by="customer")
def two_per_customer(context: TaskContext, customer: str, n: int = 0, sleep: float = 0.2) -> int:
    _run(context, sleep, customer)
    return n


@shard_task(takes_context=True, key="customer", max_concurrency=2, limit_by="customer")
def two_per_key(context: TaskContext, customer: str, n: int = 0, sleep: float = 0.2) -> int:
    """A limit partitioned by the shard key (key_limited): the key's owner
    runs at most 2 of a customer at once in its local queue, no slot rows
    (tests/acceptance/test_key_limits.py)."""
    _run(context, sleep, customer)
    return n


@shard_task(
    takes_context=True,
    key="customer",
    max_concurrency=2,
    limit_by="customer",
    max_attempts=2,
    backoff=exponential(base=1.0, cap=0.5, jitter=0.0),
)
def two_per_key_retried(context: TaskContext, customer: str, n: int = 0, sleep: float = 0.5, fail: bool = False) -> int:
    """As two_per_key; with ``fail``, the first attempt fails at once and the
    job is READY again 0.5 s later (keeping its id, below its key's newer jobs)."""
    failing = fail and context.attempt == 1
    _run(context, 0.05 if failing else sleep, customer)
    if failing:
        raise RuntimeError("the first attempt fails")
    return n


@shard_task(takes_context=True, max_concurrency=40)
def forty_at_once(context: TaskContext, n: int = 0, sleep: float = 0.01) -> int:
    time.sleep(sleep)
    return n


@shard_task(max_concurrency=1000)
def generous_noop() -> None:
    return None


@shard_task(takes_context=True, queue_name="emails")
def email_sleep(context: TaskContext, n: int = 0, sleep: float = 0.5) -> int:
    """No limit of its own: the test sets one on its queue (SHARDQ["QUEUES"])."""
    _run(context, sleep)
    return n


@shard_task(takes_context=True)
def unlimited_sleep(context: TaskContext, n: int = 0, sleep: float = 0.01) -> int:
    time.sleep(sleep)
    return n


def _region(args: tuple, kwargs: dict) -> object:
    region = kwargs.get("region")
    return object() if region == "broken" else region


@shard_task(max_concurrency=1, limit_by=_region)
def by_region(region: str = "eu") -> str:
    return region


@shard_task(key="customer", max_concurrency=2, limit_by="customer")
def two_per_key_noop(customer: int) -> None:
    """A limit partitioned by the shard key (bench/limits.py's by_key case)."""
    return None


@shard_task(key="customer")
def keyed_noop(customer: int) -> None:
    """by_key's unlimited side: the same keys, no limit."""
    return None
