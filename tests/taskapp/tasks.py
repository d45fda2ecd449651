"""Tasks the test suite enqueues and real worker processes run."""

import asyncio
import os
import signal
import threading
import time
from datetime import timedelta

from django.db import transaction
from django.tasks import TaskContext, task

from shardq import exponential, shard_task

from .models import Ledger


@task()
def noop() -> None:
    return None


@task()
def stamp() -> float:
    """When it ran (the worker's wall clock, seconds): the bench's priority
    figures read the start of a job, and the order of jobs, from it."""
    return time.time()


#: Set by a test running a worker in its own process (tests/integration):
#: ``gate`` holds an executor thread until then.
GATE = threading.Event()


@task()
def gate() -> None:
    """Holds its executor thread until GATE is set (at most a minute)."""
    GATE.wait(timeout=60)


@task(queue_name="reports")
def add(a: int, b: int) -> int:
    return a + b


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def whoami(context: TaskContext) -> dict:
    return {"id": context.task_result.id, "attempt": context.attempt, "worker_ids": context.task_result.worker_ids}


@shard_task(key="user_id", priority=10)
def keyed(user_id: int, note: str = "") -> int:
    return user_id


@task()
def fail(message: str) -> None:
    raise ValueError(message)


@task()
def log_records() -> dict:
    """The django.tasks log records this process created so far, by level
    (a worker started with SHARDQ_TEST_COUNT_LOG_RECORDS=1; see log_records.py)."""
    from .log_records import counts

    return counts()


@shard_task(max_attempts=3, backoff=exponential(base=1.0, cap=0.0, jitter=0.0))
def flaky(fail_times: int, tag: str) -> int:
    """Fails its first ``fail_times`` attempts (counted in the ledger)."""
    attempts = Ledger.objects.filter(worker=f"flaky:{tag}").count()
    Ledger.objects.create(job_id=0, attempt=attempts + 1, worker=f"flaky:{tag}")
    if attempts < fail_times:
        raise RuntimeError(f"attempt {attempts + 1} fails on purpose")
    return attempts + 1


@shard_task(max_attempts=3, backoff=exponential(base=1.0, cap=0.0, jitter=0.0))
def gated_flaky(tag: str) -> int:
    """Holds its thread until GATE is set, then fails its first run (counted
    in the ledger, as flaky) and succeeds after."""
    GATE.wait(timeout=60)
    return flaky.func(1, tag)


@task(takes_context=True)
def gated_in_transaction(context: TaskContext) -> int:
    """Holds its thread until GATE is set, then completes itself with a
    ledger row in one transaction (``shardq.complete_in_transaction``)."""
    import shardq

    GATE.wait(timeout=60)
    with transaction.atomic():
        shardq.complete_in_transaction(context, return_value=7)
        Ledger.objects.create(job_id=int(context.task_result.id), attempt=context.attempt, worker="in-transaction")
    return 7


def write_ledger_row(context: TaskContext) -> None:
    """One ledger row for this attempt (job, attempt, fence, worker), in its own transaction."""
    with transaction.atomic():
        Ledger.objects.create(
            job_id=int(context.task_result.id),
            attempt=context.attempt,
            fence=getattr(context, "fence", 0),
            worker=context.task_result.worker_ids[-1],
        )


@shard_task(takes_context=True, max_attempts=5)
def ledger(context: TaskContext, n: int = 0, sleep: float = 0.0) -> int:
    """Writes one ledger row in its own transaction (an execution record)."""
    if sleep:
        time.sleep(sleep)
    write_ledger_row(context)
    return n


@shard_task(takes_context=True, max_attempts=5)
def ledger_first(context: TaskContext, n: int = 0, sleep: float = 0.0) -> int:
    """``ledger`` the other way round: the row as it begins, then the sleep."""
    write_ledger_row(context)
    if sleep:
        time.sleep(sleep)
    return n


@task()
def not_json() -> object:
    return object()


@shard_task(max_attempts=3)
def suicide() -> None:
    """Kills its own worker process on every attempt (a poison job)."""
    os.kill(os.getpid(), signal.SIGKILL)


@shard_task(max_attempts=1)
def suicide_once() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# -- unique tasks (tests/integration/test_unique.py) --------------------------------


@shard_task(unique_for=60)
def unique_report(account_id: int, kind: str = "daily") -> str:
    return f"{kind} report of {account_id}"


@shard_task(unique_for=60)
def unique_invoice(account_id: int, kind: str = "daily") -> str:
    """Same arguments as unique_report: a different task, so never the same key."""
    return f"{kind} invoice of {account_id}"


@shard_task(unique_for=2.0)
def unique_brief(n: int) -> int:
    """Unique for 2 s: the tests wait the key out. Long enough that the
    enqueues a test makes after taking the key over still fall inside it on a
    loaded machine (0.3 s failed once under two xdist workers)."""
    return n


@shard_task(unique_for=0.3)
def unique_fleeting(n: int) -> int:
    """Unique for 0.3 s, under UNIQUE_CACHE_MARGIN_SECONDS: never cached."""
    return n


@shard_task(unique_for=timedelta(minutes=5), unique_key="account_id", key="account_id")
def unique_per_account(account_id: int, note: str = "") -> int:
    return account_id


def order_of(args: tuple, kwargs: dict) -> str:
    """The unique key of unique_per_order: the order's id, wherever it was passed."""
    order = kwargs["order"] if "order" in kwargs else args[0]
    return f"order-{order['id']}"


@shard_task(unique_for=60, unique_key=order_of)
def unique_per_order(order: dict) -> int:
    return order["id"]


NOT_A_TASK = 42


def plain_function() -> None:
    """A module-level function that is not a Task."""


@shard_task(key="account_id", salt=8)
def hot_account(account_id: int, n: int = 0) -> int:
    """A hot key spread over 8 sub-keys (hot-key salting)."""
    return n


@task()
def echo(*args, **kwargs) -> list:
    """Takes any arguments (tests about argument values, not signatures)."""
    return [list(args), kwargs]


@shard_task(key="user_id", ordered=True)
def ordered_step(user_id: int, n: int, sleep: float = 0.0) -> int:
    """Appends "<start> <end> <user_id> <n>" (CLOCK_MONOTONIC, shared by every
    process on the host) to $SHARDQ_TEST_TRACE: per-key order is read there."""
    began = time.monotonic()
    if sleep:
        time.sleep(sleep)
    line = f"{began:.6f} {time.monotonic():.6f} {user_id} {n}\n"
    # One write(2) with O_APPEND: lines from many processes never interleave.
    fd = os.open(os.environ["SHARDQ_TEST_TRACE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return n


@shard_task(takes_context=True)
def wf_node(context: TaskContext, tag: str, fail: bool = False, read_parents: bool = True) -> dict:
    """A workflow step (tests/integration/test_workflows.py): writes one ledger
    row, returns its tag and what it saw of its parents, or fails."""
    write_ledger_row(context)
    if fail:
        raise RuntimeError(f"{tag} fails on purpose")
    parents = {}
    if read_parents:
        parents = {
            name: [result.status, result.return_value["tag"] if result.status == "SUCCESSFUL" else None]
            for name, result in context.parent_results.items()
        }
    return {"tag": tag, "parents": parents}


@shard_task(takes_context=True)
def wf_fan_in(context: TaskContext) -> int:
    """A fan-in step: how many of its parents had written their ledger row
    when it started (all of them, or an edge was not respected)."""
    from shardq.models import Edge

    parents = Edge.objects.filter(child=int(context.task_result.id)).values("parent")
    seen = Ledger.objects.filter(job_id__in=parents).count()
    write_ledger_row(context)
    return seen
