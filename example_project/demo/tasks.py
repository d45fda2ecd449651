import time

from django.tasks import TaskContext, task

from shardq import Workflow, advance, exponential, shard_task

from .models import Order, OrderAudit, Receipt


@shard_task(
    key="customer_id",
    queue_name="emails",
    max_attempts=3,
    backoff=exponential(base=2, cap=60),
    takes_context=True,
    # The mail provider's quota: at most 500 receipts a second, counted
    # across every worker (docs/limits.md); the admin's Limits page and
    # `manage.py shardq_status` show it.
    rate_limit="500/s",
)
def send_receipt(context: TaskContext, customer_id: int, order_id: int) -> int:
    """Record that a receipt went out for the order (once: the order is unique)."""
    order = Order.objects.get(pk=order_id)
    Receipt.objects.get_or_create(order=order, defaults={"worker": context.task_result.worker_ids[-1]})
    return order.total_cents


# Django's own decorator passes shardq's options on: past 5 seconds the
# attempt is FAILED with shardq.TaskTimeout, raised in the task's thread.
@task(queue_name="reports", timeout=5)
def add(a: int, b: int) -> int:
    return a + b


# The order workflow (docs/workflows.md): charge, then pack and send the
# receipt side by side, then close. Each step moves the order's status
# forward with shardq.advance, so a late or repeated step never moves it back.


def set_status(order_id: int, status: str) -> bool:
    return advance(Order.objects.filter(pk=order_id), to=Order.RANKS[status], status=status)


@shard_task(key="order_id")
def charge_card(order_id: int) -> int:
    set_status(order_id, "charged")
    return Order.objects.get(pk=order_id).total_cents


@shard_task(key="order_id", takes_context=True)
def pack_items(context: TaskContext, order_id: int) -> str:
    charged = context.parent_results["charge_card"].return_value
    set_status(order_id, "packed")
    return f"packed order {order_id} ({charged} cents charged)"


@shard_task(key="order_id")
def ship_order(order_id: int) -> bool:
    """Sets "shipped"; a late run after the order closed changes nothing (returns False)."""
    return set_status(order_id, "shipped")


@shard_task(key="order_id", takes_context=True)
def close_order(context: TaskContext, order_id: int) -> dict:
    set_status(order_id, "closed")
    return {name: result.status for name, result in sorted(context.parent_results.items())}


def order_workflow(order: Order) -> Workflow:
    wf = Workflow(name=f"order-{order.pk}")
    charge = wf.add(charge_card, order_id=order.pk)
    pack = wf.add(pack_items, order_id=order.pk, after=[charge])
    mail = wf.add(send_receipt, customer_id=order.customer_id, order_id=order.pk, after=[charge])
    ship = wf.add(ship_order, order_id=order.pk, after=[pack])
    wf.add(close_order, order_id=order.pk, after=[ship, mail], on_parent_failure="run")
    return wf


# Fair share inside a queue (docs/fairness.md): each tenant's reports take
# turns on the workers' threads, so a tenant that enqueues thousands at once
# (the demo's "noisy tenant" button, /tenants/) delays another's by about
# one report, not by its whole backlog.
@shard_task(fair_key="tenant")
def build_report(tenant: str, n: int, seconds: float = 0.02) -> int:
    time.sleep(seconds)  # the report's work
    return n


# A backfill (docs/durable.md): walks every order by keyset in batches of
# 100; each batch's audits commit in one transaction with the walk's cursor,
# so a `kill -9` of its worker rolls the batch in flight back and the next
# owner resumes after the last committed batch, and a Ctrl-C (SIGTERM to the
# workers) hands it back READY at its next batch. ``pause`` slows each batch
# down (the demo's, to be killed mid-walk).
@shard_task(takes_context=True)
def backfill_audits(context: TaskContext, size: int = 100, pause: float = 0.0) -> dict:
    job = int(context.task_result.id)
    audited = 0
    for batch in context.iterate(Order.objects.all(), by="pk", size=size):
        OrderAudit.objects.bulk_create(
            OrderAudit(order=order, job_id=job, total_cents=order.total_cents) for order in batch
        )
        audited += len(batch)
        if pause:
            time.sleep(pause)
    return {"audits": OrderAudit.objects.filter(job_id=job).count(), "audited_by_this_run": audited}
