"""Tasks of the shardq.testing tests (tests/integration/test_testing_helpers.py):
run by drain() inside the test's process, never by a worker."""

import asyncio
from datetime import timedelta

from django.db import connection, transaction
from django.tasks import TaskContext, task

import shardq
from shardq import Workflow, exponential, shard_task

from .models import Ledger


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="reports")
def report(name: str) -> str:
    return f"report {name}"


@task()
def fails() -> None:
    raise ValueError("the card was declined")


@shard_task(max_attempts=3, backoff=exponential(base=2, cap=30), takes_context=True)
def flaky(context: TaskContext, succeed_on: int) -> int:
    """Raises until its attempt ``succeed_on``; returns the attempt that succeeded."""
    if context.attempt < succeed_on:
        raise ConnectionError(f"attempt {context.attempt}: the provider timed out")
    return context.attempt


@task()
async def async_multiply(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a * b


@task()
async def async_ledger(job_id: int) -> int:
    """An async task using the ORM (through sync_to_async): the test's connection."""
    row = await Ledger.objects.acreate(job_id=job_id, attempt=1, worker="async")
    return row.pk


@task(takes_context=True)
def whoami(context: TaskContext) -> dict:
    return {
        "id": context.task_result.id,
        "attempt": context.attempt,
        "worker_ids": context.task_result.worker_ids,
        "status": context.task_result.status,
        "fence": getattr(context, "fence", None),
        "cancelled": context.is_cancelled(),
    }


@task()
def forever(n: int) -> int:
    """Enqueues itself again, for ever: drain must stop it."""
    forever.enqueue(n + 1)
    return n


@task()
def fan_out(count: int) -> int:
    """Enqueues ``count`` add jobs."""
    for i in range(count):
        add.enqueue(i, i)
    return count


@task()
def enqueue_on_commit(a: int) -> None:
    """The common Django pattern: enqueue once the task's own writes commit."""
    transaction.on_commit(lambda: add.enqueue(a, 100))


@task()
def write_then_fail(job_id: int) -> None:
    Ledger.objects.create(job_id=job_id, attempt=1, worker="write_then_fail")
    raise RuntimeError("failed after writing")


@task()
def broken_sql(job_id: int) -> None:
    """Writes a row, then runs SQL that fails: the transaction it ran in is aborted."""
    Ledger.objects.create(job_id=job_id, attempt=1, worker="broken_sql")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")


@task()
def not_json() -> object:
    return {1, 2}


@task(takes_context=True)
def cancels_itself(context: TaskContext) -> str:
    shardq.cancel(context.task_result.id, reason="changed my mind")
    return "returned anyway"


@shard_task(takes_context=True)
def charge_fenced(context: TaskContext, order_id: int) -> None:
    """Transactional completion: the task commits its own outcome with its write."""
    with shardq.fenced(context) as done:
        Ledger.objects.create(job_id=order_id, attempt=context.attempt, worker="fenced")
        done.return_value = {"charged": order_id}


# A workflow chain: charge -> pack -> close (close also after a failing step).


@shard_task(key="order_id")
def charge(order_id: int) -> int:
    return order_id * 100


@shard_task(key="order_id", takes_context=True)
def pack(context: TaskContext, order_id: int) -> str:
    charged = context.parent_results["charge"].return_value
    return f"packed {order_id} after charging {charged}"


@shard_task(key="order_id", takes_context=True)
def close(context: TaskContext, order_id: int) -> dict:
    return {name: str(result.status) for name, result in sorted(context.parent_results.items())}


@shard_task(key="order_id")
def refuse(order_id: int) -> None:
    raise PermissionError(f"order {order_id} is on hold")


def order_chain(order_id: int, *, failing: bool = False) -> Workflow:
    wf = Workflow(name=f"order-{order_id}")
    first = wf.add(refuse if failing else charge, order_id=order_id, step_name="charge")
    packed = wf.add(pack, order_id=order_id, after=[first])
    wf.add(close, order_id=order_id, after=[packed, first], on_parent_failure="run")
    return wf


LATER = timedelta(hours=1)
