"""Tasks shared fairly by tenant (docs/fairness.md) for
tests/acceptance/test_fairness.py and bench/fairness.py. Each run appends
``start``/``end`` lines (job id, wall-clock time, pid, tenant) to
$SHARDQ_LIMIT_LEDGER, as tests/taskapp/limit_tasks.py's do."""

from django.tasks import TaskContext

from shardq import shard_task

from .limit_tasks import _run


@shard_task(takes_context=True, fair_key="tenant")
def tenant_job(context: TaskContext, tenant: str, n: int = 0, sleep: float = 0.01) -> int:
    """Shared by ``tenant``, counted by starts (fair_by="count", the default)."""
    _run(context, sleep, tenant)
    return n


@shard_task(takes_context=True, fair_key="tenant", fair_by="time")
def tenant_timed(context: TaskContext, tenant: str, n: int = 0, sleep: float = 0.01) -> int:
    """Shared by ``tenant`` in measured worker time (fair_by="time")."""
    _run(context, sleep, tenant)
    return n


@shard_task(takes_context=True)
def unfair_job(context: TaskContext, tenant: str, n: int = 0, sleep: float = 0.01) -> int:
    """The same work with no fair key: FIFO, as before fairness."""
    _run(context, sleep, tenant)
    return n


@shard_task(takes_context=True, fair_key="tenant", key="account", ordered=True)
def tenant_ordered(context: TaskContext, tenant: str, account: str, n: int = 0, sleep: float = 0.005) -> int:
    """An ordered key under fairness: an account's jobs one after another, in order."""
    _run(context, sleep, f"{tenant}/{account}/{n}")
    return n
