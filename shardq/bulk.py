"""Bulk actions on every job matching a filter (docs/admin.md, "Bulk
actions"; ``manage.py shardq_jobs``): retry, cancel, discard and run now.

The jobs are walked by keyset over the primary key, in batches: each batch
reads the next ``batch`` ids of the filtered queryset (``id > last``, id
order; only jobs in a status the action applies to), then runs the action's
own compare-and-set statement on them and records the progress, all in one
transaction of its own. The statement checks each job's status again, so a
job that moved on between the read and the write (claimed, finished,
retried by someone else) is left alone and counted as skipped:

- **retry** (``admin_retry_failed_jobs``): FAILED → READY, fresh attempts,
  due now, ``status_rank + 1``, its shard NOTIFYed; a workflow child it had
  cancelled waits again (``revive_children``).
- **cancel** (``cancel_jobs``, as ``shardq.cancel``): READY, CLAIMED,
  RUNNING, WAITING or SUSPENDED → FAILED with a ``Cancelled`` error and
  ``status_rank + 1``, so a running attempt's outcome can no longer land; its
  worker is told (``context.is_cancelled()``).
- **discard** (``admin_discard_failed_jobs``): deletes FAILED jobs.
- **run now** (``bulk_run_now``): a READY job not due yet becomes due now.

No action ever writes a RUNNING job except cancel, which is fenced as
``shardq.cancel`` is. Nothing holds a lock across batches: workers run
beside it. Progress lives in ``shardq_bulk_operation`` (one row an
operation), which the admin's progress page reads.
"""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import QuerySet

from .conf import get_config
from .db import operations

logger = logging.getLogger("shardq.bulk")

#: Jobs a batch acts on: one short transaction each.
DEFAULT_BATCH = 5000
MAX_BATCH = 100_000
#: A running operation whose row has not moved for this long is shown as
#: interrupted (its process died); its jobs up to ``last_id`` are done.
STALE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class BulkAction:
    name: str
    #: The statuses a job must be in to be acted on (read and checked again by the statement).
    statuses: tuple[str, ...]
    #: The permission codename (app shardq) the admin requires.
    permission: str
    #: "retried", ... for messages.
    verb: str
    title: str


ACTIONS: dict[str, BulkAction] = {
    "retry": BulkAction("retry", ("FAILED",), "retry_job", "retried", "Retry"),
    "cancel": BulkAction(
        "cancel", ("READY", "CLAIMED", "RUNNING", "WAITING", "SUSPENDED"), "cancel_job", "cancelled", "Cancel"
    ),
    "discard": BulkAction("discard", ("FAILED",), "discard_job", "discarded", "Discard"),
    "run-now": BulkAction("run-now", ("READY",), "run_job_now", "made due now", "Run now"),
}


def action_named(name: str) -> BulkAction:
    try:
        return ACTIONS[name]
    except KeyError:
        raise ValueError(f"unknown bulk action {name!r}: one of {', '.join(ACTIONS)}") from None


@dataclass(slots=True)
class BulkResult:
    matched: int = 0  # candidates walked
    done: int = 0  # acted on
    skipped: int = 0  # moved on between the read and the write
    batches: int = 0


def candidates(action: BulkAction, queryset: QuerySet) -> QuerySet:
    """The filtered jobs this action may apply to, with no ordering or
    annotation the walk does not need."""
    return queryset.filter(status__in=action.statuses).order_by()


def count_matching(action: BulkAction, queryset: QuerySet, cap: int | None = None) -> int:
    """How many jobs the action would walk (at most ``cap``: a bounded count
    for a progress bar, never a scan of a huge table to the end)."""
    ids = candidates(action, queryset).values("id")
    if cap is not None:
        ids = ids[:cap]
    return ids.count()


def apply_batch(action: BulkAction, ids: list[int], using: str = DEFAULT_DB_ALIAS) -> int:
    """Run the action's statement on ``ids`` (in the caller's transaction):
    how many it acted on."""
    config = get_config()
    if action.name == "retry":
        rows = operations.run(
            "admin_retry_failed_jobs", {"ids": ids, "notify": config.notify, "channel": config.channel}, using=using
        )
        if rows:
            operations.run("revive_children", {"ids": [row[0] for row in rows]}, using=using)
    elif action.name == "cancel":
        rows = operations.run("cancel_jobs", {"ids": ids, "reason": "bulk cancel"}, using=using)
    elif action.name == "discard":
        rows = operations.run("admin_discard_failed_jobs", {"ids": ids}, using=using)
    else:
        rows = operations.run(
            "bulk_run_now", {"ids": ids, "notify": config.notify, "channel": config.channel}, using=using
        )
    return len(rows)


def run(
    action: BulkAction,
    queryset: QuerySet,
    *,
    batch: int = DEFAULT_BATCH,
    operation_id: int | None = None,
    after: int = 0,
    progress: Callable[[BulkResult], None] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> BulkResult:
    """Apply ``action`` to every job of ``queryset`` it applies to, batch by
    batch (keyset over id from ``after``), each batch one transaction that
    also records the progress of ``operation_id`` (when given)."""
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch {batch!r}: give a whole number from 1 to {MAX_BATCH}")
    walk = candidates(action, queryset).using(using)
    result = BulkResult()
    last = after
    while True:
        with transaction.atomic(using=using):
            ids = list(walk.filter(id__gt=last).order_by("id").values_list("id", flat=True)[:batch])
            if not ids:
                break
            done = apply_batch(action, ids, using)
            last = ids[-1]
            if operation_id is not None:
                operations.run(
                    "bulk_operation_progress",
                    {"id": operation_id, "done": done, "skipped": len(ids) - done, "last_id": last},
                    using=using,
                    fetch="none",
                )
        result.matched += len(ids)
        result.done += done
        result.skipped += len(ids) - done
        result.batches += 1
        if progress is not None:
            progress(result)
    return result


def start(action: BulkAction, filter_text: str, total: int, by: str, using: str = DEFAULT_DB_ALIAS) -> int:
    """The operation's row (state running): its id."""
    row = operations.run(
        "bulk_operation_start",
        {"action": action.name, "filter": filter_text, "total": total, "by": by},
        using=using,
        fetch="one",
    )
    return int(row[0])


def finish(operation_id: int, error: str | None = None, using: str = DEFAULT_DB_ALIAS) -> None:
    operations.run(
        "bulk_operation_finish",
        {"id": operation_id, "state": "failed" if error else "done", "error": error},
        using=using,
        fetch="none",
    )


def get(operation_id: int, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any] | None:
    return operations.run("bulk_operation_get", {"id": operation_id}, using=using, fetch="one", named=True)


def run_in_background(
    action: BulkAction,
    queryset: QuerySet,
    operation_id: int,
    *,
    batch: int = DEFAULT_BATCH,
    done: Callable[[BulkResult | None, str | None], None] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> threading.Thread:
    """Run the operation on a thread of this (web) process, so the request
    that started it returns at once to the progress page; ``done(result,
    error)`` is called on that thread at the end (the admin's LogEntry)."""

    def work() -> None:
        result, error = None, None
        try:
            result = run(action, queryset, batch=batch, operation_id=operation_id, using=using)
        except Exception as exc:  # recorded on the row and logged: the page shows it
            logger.exception("bulk %s #%s failed", action.name, operation_id)
            error = f"{type(exc).__name__}: {exc}"
        try:
            finish(operation_id, error, using=using)
            if done is not None:
                done(result, error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=work, name=f"shardq-bulk-{operation_id}", daemon=True)
    thread.start()
    return thread
