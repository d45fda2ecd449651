from django.tasks import TaskContext, task

from shardq import exponential, shard_task

from .models import Order, Receipt


@shard_task(
    key="customer_id", queue_name="emails", max_attempts=3, backoff=exponential(base=2, cap=60), takes_context=True
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
