from django.tasks import TaskContext, task

from shardq import exponential, shard_task

from .models import Order, Receipt


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


@task(queue_name="reports")
def add(a: int, b: int) -> int:
    return a + b
