"""Transactional completion: a task commits its own writes and its outcome together.

By default the worker writes a job's outcome after the task returns, in the
completer's batched, fenced statement: a task's own database writes and its
SUCCESSFUL mark are two commits, so a crash between them runs the task again
(at-least-once). A task that needs its side effect committed exactly once
writes both in one transaction::

    @shard_task(takes_context=True)
    def charge(context, order_id):
        with shardq.fenced(context) as done:
            Payment.objects.create(order_id=order_id)
            done.return_value = order_id

or, with ``transaction.atomic()`` of its own::

    with transaction.atomic():
        version = shardq.complete_in_transaction(context, return_value=order_id)
        Payment.objects.create(order_id=order_id, shard_version=version)

The completion is the same fenced write as the completer's (``fence <=
claim's fence AND status_rank < claim's rank + 1``) on the task's Django
connection. If it matches no row — the shard was taken over, the job rescued
or moved on — it raises ``FenceLost`` and the transaction rolls back: a
worker that lost its lease can run a task to its end but cannot commit
anything of it. The worker then writes nothing more for that attempt (the
outcome is either committed already, or rejected and counted).

Sync tasks only: the Django ORM connection of an async task is not the one
the worker can see.
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from .conf import get_config
from .db import operations
from .exceptions import FenceLost


@dataclass(slots=True)
class Completion:
    """What ``fenced`` yields: set ``return_value`` inside the block."""

    return_value: object = None
    shard_version: int | None = None


def _fencing_of(context):
    for name in ("fence", "shard", "rank", "completion_state"):
        if not hasattr(context, name):
            raise TypeError(
                "complete_in_transaction needs the ShardqTaskContext a shardq worker passes to a "
                "task declared with takes_context=True (it carries the attempt's fence and rank); "
                f"got {type(context).__name__}."
            )
    return context


class CommittedByTask:
    """One attempt's answer to "did the task commit its own outcome?":
    ``complete_in_transaction`` marks it once the task's transaction has
    committed the outcome, and the executor then writes nothing more."""

    __slots__ = ("return_value_json", "written")

    def __init__(self) -> None:
        self.written = False
        self.return_value_json: str | None = None

    def mark(self, return_value_json: str) -> None:
        self.written = True
        self.return_value_json = return_value_json


def complete_in_transaction(context, return_value=None, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Mark this attempt's job SUCCESSFUL on ``using``'s connection, fenced.

    Call it inside ``transaction.atomic()``: the outcome then commits exactly
    when the task's own writes do. Returns the shard's claim version, which is
    locked until COMMIT (no takeover can commit in between). Raises
    ``FenceLost`` when this attempt no longer owns the job, ``TaskTimeout``
    once its deadline has passed; raises
    ``TypeError`` when ``return_value`` is not JSON.
    """
    context = _fencing_of(context)
    # Past its deadline the attempt's outcome is the timeout's (written by
    # the worker under the same rank): a late completion must not race it.
    check_timeout = getattr(context, "check_timeout", None)
    if check_timeout is not None:
        check_timeout()
    try:
        value_json = json.dumps(return_value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the return value is not JSON ({exc}); return str, int, float, bool, None, list or dict"
        ) from exc
    state = context.completion_state
    job_id = int(context.task_result.id)
    idle_ms = int(get_config().lease_ttl_seconds * 1000)
    row = operations.run(
        "complete_job_in_transaction",
        {
            "id": job_id,
            "fence": context.fence,
            "rank": context.rank,
            "shard": context.shard,
            "return_value": value_json,
            "idle_ms": idle_ms,
        },
        using=using,
        fetch="one",
    )
    if row is None:
        raise FenceLost(
            f"job {job_id}: the fence {context.fence} of this attempt is no longer current "
            f"(shard {context.shard} changed hands or the job moved on); nothing of it is committed"
        )

    def committed():
        state.mark(value_json)

    # The executor skips its own write only once this one has committed; on a
    # rollback (the task raised after calling us) the outcome is its to write.
    if connections[using].in_atomic_block:
        transaction.on_commit(committed, using=using)
    else:
        committed()
    return row[0]


@contextmanager
def fenced(context, *, using: str = DEFAULT_DB_ALIAS):
    """``transaction.atomic()`` whose COMMIT also marks the job SUCCESSFUL (fenced).

    Yields a ``Completion``; set its ``return_value``. Raises ``FenceLost``
    (and rolls the block back) when this attempt lost the job.
    """
    done = Completion()
    with transaction.atomic(using=using):
        yield done
        done.shard_version = complete_in_transaction(context, done.return_value, using=using)
