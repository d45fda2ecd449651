"""Live queue controls (docs/operations.md, "Queue controls"): pause and
resume a queue, and override how many of its jobs each worker holds at once.

The state is a row of ``shardq_queue_control`` a queue; each write is
followed (at commit) by a NOTIFY on ``<CHANNEL>_queue`` that makes every
worker read the table again at once, and every worker reads it at each poll
interval too (a NOTIFY lost with a LISTEN connection). A paused queue's jobs
are not claimed: jobs already claimed and not started are handed back,
running jobs finish, and enqueue keeps working (the jobs wait READY). A
worker that starts reads the table before its first claim, so the state
survives restarts.

``manage.py shardq_queue`` and the admin's Queues page call these; so may
application code (in or out of a transaction: the change and its NOTIFY
commit with it).
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, transaction

from .conf import get_config
from .db import operations

#: The longest queue name a control accepts (queue names are Django's, any str).
MAX_QUEUE_NAME = 200


def control_channel() -> str:
    """The channel a control's NOTIFY goes out on: ``<CHANNEL>_queue``."""
    return get_config().channel + "_queue"


def check_queue_name(queue: object) -> str:
    if not isinstance(queue, str) or not queue or len(queue) > MAX_QUEUE_NAME or "\x00" in queue:
        raise ValueError(
            f"queue name {queue!r}: give the queue's name as a non-empty str of at most "
            f"{MAX_QUEUE_NAME} characters (as in TASKS[...]['QUEUES'] or @shard_task(queue_name=...))"
        )
    return queue


def check_concurrency(concurrency: object) -> int | None:
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(
            f"concurrency {concurrency!r}: give an int >= 1 (jobs of the queue each worker holds at once), "
            "or None to clear the override (pause the queue to stop it instead)"
        )
    return concurrency


def pause(queue: str, by: str = "", using: str = DEFAULT_DB_ALIAS) -> bool:
    """Pause ``queue`` on every worker; True when it was not paused before."""
    return _set_paused(queue, True, by, using)


def resume(queue: str, by: str = "", using: str = DEFAULT_DB_ALIAS) -> bool:
    """Resume ``queue`` on every worker; True when it was paused before."""
    return _set_paused(queue, False, by, using)


def _set_paused(queue: str, paused: bool, by: str, using: str) -> bool:
    params = {"queue": check_queue_name(queue), "paused": paused, "by": by, "channel": control_channel()}
    with transaction.atomic(using=using):
        row = operations.run("set_queue_paused", params, using=using, fetch="one")
    return bool(row[1])


def set_concurrency(queue: str, concurrency: int | None, by: str = "", using: str = DEFAULT_DB_ALIAS) -> None:
    """At most ``concurrency`` jobs of ``queue`` in each worker's memory
    (claimed or running) at once; None clears the override."""
    params = {
        "queue": check_queue_name(queue),
        "concurrency": check_concurrency(concurrency),
        "by": by,
        "channel": control_channel(),
    }
    with transaction.atomic(using=using):
        operations.run("set_queue_concurrency", params, using=using, fetch="none")


@dataclass(frozen=True, slots=True)
class QueueState:
    queue_name: str
    paused: bool = False
    concurrency: int | None = None
    updated_at: datetime | None = None
    updated_by: str = ""


def queue_states(using: str = DEFAULT_DB_ALIAS, configured: list[str] | None = None) -> list[QueueState]:
    """Every configured queue and every queue with a row, by name: what the
    admin and ``shardq_status`` show."""
    rows = {row["queue_name"]: row for row in operations.run("queue_control_report", using=using, named=True)}
    names = sorted(set(configured or ()) | set(rows))
    return [QueueState(**rows[name]) if name in rows else QueueState(name) for name in names]
