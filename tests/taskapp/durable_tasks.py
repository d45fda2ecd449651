"""Durable tasks (shardq/durable.py) the durable tests run: steps, iterations, sleeps and waits."""

import os
import time
from datetime import timedelta

import psycopg
from django.db import connection
from django.tasks import TaskContext

from shardq import SignalTimeout, exponential, shard_task

from .models import Item, ItemLedger, StepRun


def ran(job_id: int, name: str, value: object) -> object:
    """A step's function: records that it really ran, returns ``value``."""
    StepRun.objects.create(job_id=job_id, name=name)
    return value


# Retried at once: what is checked is which steps run again, not when (the
# default backoff waited 1.5-2 s and 3-4 s between the three attempts).
@shard_task(takes_context=True, max_attempts=3, backoff=exponential(base=1.0, cap=0.0, jitter=0.0))
def three_steps(context: TaskContext, fail_times: int = 2) -> list:
    """Three steps; fails after the second while fewer than ``fail_times``
    attempts have failed (the job's recorded errors)."""
    job = int(context.task_result.id)
    one = context.step("one", ran, job, "one", {"n": 1})
    two = context.step("two", ran, job, "two", [2])
    if len(context.task_result.errors) < fail_times:
        raise RuntimeError("fails after step two, on purpose")
    three = context.step("three", ran, job, "three", 3)
    return [one, two, three]


@shard_task(takes_context=True)
def twice_named(context: TaskContext) -> None:
    context.step("same", ran, int(context.task_result.id), "same", 1)
    context.step("same", ran, int(context.task_result.id), "same", 2)


def _bump_fence(shard: int) -> None:
    """A takeover's fence change, as another worker's claim makes it: the
    shard's claim version moves on (over a connection of its own)."""
    settings = connection.settings_dict
    with psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"], port=settings["PORT"], autocommit=True
    ) as conn:
        conn.execute(
            "UPDATE shardq_shard SET claim_version = nextval('shardq_claim_version_seq') WHERE shard = %s",
            [shard],
        )


@shard_task(takes_context=True)
def backfill(context: TaskContext, tenant: int, size: int = 10, pause: float = 0.0, bump_at: int | None = None) -> dict:
    """Walks the tenant's items by keyset, one ledger row per item in each
    batch's transaction; ``bump_at``: the fence moves on during that batch
    (of this run), before its cursor is written."""
    job = int(context.task_result.id)
    plan = context.step("plan", lambda: {"items": Item.objects.filter(tenant=tenant).count()})
    batches = 0
    for batch in context.iterate(Item.objects.filter(tenant=tenant), by="pk", size=size):
        batches += 1
        ItemLedger.objects.bulk_create(
            ItemLedger(item_id=item.pk, job_id=job, fence=context.fence, batch=batches, pid=os.getpid())
            for item in batch
        )
        if bump_at is not None and batches == bump_at:
            _bump_fence(context.shard)
        if pause:
            time.sleep(pause)
    return {"items": plan["items"], "batches_this_run": batches}


@shard_task(takes_context=True)
def pages(context: TaskContext, last: int) -> list:
    """The generic form: pages of numbers from a function of the cursor."""
    seen = []

    def page(cursor):
        start = cursor or 0
        items = list(range(start, min(start + 3, last)))
        return items, (start + 3 if start + 3 < last else None)

    for batch in context.iterate(page):
        seen.extend(batch)
    return seen


@shard_task(takes_context=True)
def napper(context: TaskContext, seconds: float) -> dict:
    """A step, a sleep, a step: returns when the second run began (wall clock)."""
    job = int(context.task_result.id)
    context.step("before", ran, job, "before", 1)
    context.sleep(timedelta(seconds=seconds))
    woke = time.time()
    context.step("after", ran, job, "after", 2)
    return {"woke": woke}


@shard_task(takes_context=True)
def approver(context: TaskContext, timeout: float | None = None) -> dict:
    """Waits for signal "approved" and returns its payload (or says it timed out)."""
    job = int(context.task_result.id)
    context.step("asked", ran, job, "asked", 1)
    try:
        reply = context.wait_for("approved", timeout=None if timeout is None else timedelta(seconds=timeout))
    except SignalTimeout:
        return {"timed_out": True, "woke": time.time()}
    return {"reply": reply, "woke": time.time()}


def _record_batch_start(job: int, first_item: int) -> None:
    settings = connection.settings_dict
    with psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"], port=settings["PORT"], autocommit=True
    ) as conn:
        conn.execute(
            "INSERT INTO taskapp_batchrun (job_id, first_item, pid) VALUES (%s, %s, %s)", [job, first_item, os.getpid()]
        )


@shard_task(takes_context=True)
def churn_backfill(context: TaskContext, tenant: int, size: int = 100, pause: float = 0.0) -> dict:
    """The fault tests' backfill: each batch's start is recorded outside its
    transaction (BatchRun), its items in the ledger inside it."""
    job = int(context.task_result.id)
    batches = 0
    for batch in context.iterate(Item.objects.filter(tenant=tenant), by="pk", size=size):
        _record_batch_start(job, batch[0].pk)
        ItemLedger.objects.bulk_create(
            ItemLedger(item_id=item.pk, job_id=job, fence=context.fence, batch=batches, pid=os.getpid())
            for item in batch
        )
        batches += 1
        if pause:
            time.sleep(pause)
    return {"batches_this_run": batches}


@shard_task(takes_context=True)
def late_step(context: TaskContext) -> None:
    """A step recorded after the attempt's fence moved on (a zombie's)."""
    _bump_fence(context.shard)
    context.step("late", ran, int(context.task_result.id), "late", 1)


@shard_task(takes_context=True, max_concurrency=1)
def one_at_a_time(context: TaskContext, wait: bool) -> str:
    """Under a concurrency limit of 1: waits for signal "go" when ``wait``."""
    if wait:
        return context.wait_for("go")
    return "ran"


@shard_task(takes_context=True, max_attempts=2)
def flaky_backfill(context: TaskContext, tenant: int, size: int, fail_after: int) -> dict:
    """A step, then the tenant's items in batches of ``size``, one ledger row
    per item; the first attempt raises after batch ``fail_after``."""
    job = int(context.task_result.id)
    plan = context.step("plan", ran, job, "plan", {"items": Item.objects.filter(tenant=tenant).count()})
    batches = 0
    for batch in context.iterate(Item.objects.filter(tenant=tenant), by="pk", size=size):
        batches += 1
        ItemLedger.objects.bulk_create(
            ItemLedger(item_id=item.pk, job_id=job, fence=0, batch=batches) for item in batch
        )
        if not context.task_result.errors and batches == fail_after:
            raise RuntimeError(f"fails after batch {batches}, on purpose")
    return {"items": plan["items"], "batches_this_run": batches}


@shard_task(takes_context=True, max_attempts=1)
async def async_stepper(context: TaskContext) -> object:
    """An ``async def`` task calling a durable call: refused, saying why."""
    return context.step("one", lambda: 1)


@shard_task(key="account", ordered=True, takes_context=True)
def ordered_napper(context: TaskContext, account: int, n: int, pause: str = "") -> int:
    """An ordered key's job: records "start n" (a step), then suspends when
    ``pause`` says so ("sleep": 2 s, "wait": for signal "go"), then records
    "end n". The StepRun ids give the order the key's jobs ran in."""
    job = int(context.task_result.id)
    context.step("start", ran, job, f"start {n}", n)
    if pause == "sleep":
        context.sleep(timedelta(seconds=2))
    elif pause == "wait":
        context.wait_for("go")
    StepRun.objects.create(job_id=job, name=f"end {n}")
    return n
