"""``manage.py shardq_prune``: delete finished jobs and old bookkeeping.

Without pruning, ``shardq_job`` keeps every job ever run. The command walks
the table by primary key in batches (each its own short transaction, so it
can run beside busy workers and be stopped at any time) and deletes finished
jobs older than ``--older-than``: SUCCESSFUL ones, and dead-lettered ones
(FAILED) only with ``--failed`` — the dead-letter queue is the operator's to
look at. It also deletes every expired unique key (it holds nothing any
more), worker incarnations that have not beaten for that long and own no
shard, and shard history older than the cutoff. ``--dry-run`` counts instead.

A process that read a SUCCESSFUL result before it was pruned may still
answer ``get_result`` from its cache of finished results (the result was
real); other processes get ``TaskResultDoesNotExist``.

History (docs/architecture.md, "History"): the archiver moves finished jobs
to ``shardq_job_history`` and drops its partitions past ``HISTORY_DAYS``
itself; this command drops them too (whole partitions, never a DELETE):
those wholly older than ``--older-than`` when it is given, else than
``SHARDQ["HISTORY_DAYS"]``, and creates the partitions ahead — for a
cluster whose workers run with ``HISTORY`` off, or run rarely.
"""

import re
import time
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from ...conf import get_config
from ...db import operations
from ...db.store import WorkerStore
from ..flags import printable, whole_number
from ..progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# The range of each numeric flag (shardq.management.flags): out of it is a
# CommandError naming the flag. A century is more history than any table
# keeps; a batch is one short transaction.
MAX_OLDER_THAN_SECONDS = 100 * 365 * 86400
MAX_BATCH = 100_000


def parse_duration(value: str) -> timedelta:
    """``"90"``, ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` → a timedelta
    of at most MAX_OLDER_THAN_SECONDS."""
    match = _DURATION.match(value or "")
    if not match:
        raise CommandError(
            "--older-than must be a number with an optional unit s, m, h, d or w (e.g. 7d, 12h), "
            f"not {printable(value)!r}."
        )
    total = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]  # a huge number of digits: inf
    if not total <= MAX_OLDER_THAN_SECONDS:
        raise CommandError(
            f"--older-than must be from 0 to {MAX_OLDER_THAN_SECONDS // 86400}d (a century), not {printable(value)!r}."
        )
    return timedelta(seconds=total)


class Command(BaseCommand):
    help = (
        "Delete finished jobs older than --older-than (SUCCESSFUL; dead-lettered too with --failed), "
        "expired unique keys, long-gone workers and old shard history."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            default=None,
            help="Age of what is deleted, by finish time: e.g. 7d (default), 12h, 30m, 90s; history partitions "
            "wholly older are dropped (default: SHARDQ['HISTORY_DAYS']).",
        )
        parser.add_argument(
            "--failed",
            action="store_true",
            help="Also delete dead-lettered (FAILED) jobs; by default they are kept for inspection.",
        )
        parser.add_argument(
            "--batch", default="5000", help=f"Rows looked at per transaction, 1 to {MAX_BATCH} (default 5000)."
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (logs, cron).")

    def handle(self, *args, **options):
        age = parse_duration("7d" if options["older_than"] is None else options["older_than"])
        history = get_config().history
        history_keep: float | None = None
        if options["older_than"] is not None:
            history_keep = age.total_seconds()
        else:
            history_keep = history.keep_seconds if history is not None else None
        batch = whole_number("batch", options["batch"], maximum=MAX_BATCH)
        statuses = ["SUCCESSFUL", "FAILED"] if options["failed"] else ["SUCCESSFUL"]
        (cutoff,) = operations.run("time_before", {"age": age}, fetch="one")
        prunable, first_id, last_id = operations.run(
            "count_prunable_jobs", {"statuses": statuses, "cutoff": cutoff}, fetch="one"
        )
        if options["dry_run"]:
            keys, workers, events = operations.run("count_prunable_rest", {"cutoff": cutoff}, fetch="one")
            expired = (
                [row[0] for row in operations.run("history_expired_partitions", {"keep": history_keep})]
                if history_keep is not None
                else []
            )
            self.stdout.write(
                f"would drop {len(expired)} history partitions" + (f" ({', '.join(expired)})" if expired else "")
            )
            self.stdout.write(
                f"would delete (finished before {cutoff:%Y-%m-%d %H:%M:%S %Z}): {prunable} jobs "
                f"({' and '.join(statuses)}), {keys} expired unique keys, {workers} worker rows, "
                f"{events} shard events"
            )
            return
        began = time.monotonic()
        if history_keep is not None:
            self._drop_history(history_keep, history.partition_seconds if history is not None else 86400)
        deleted = self._prune_jobs(statuses, cutoff, batch, prunable, first_id, last_id, options["no_progress"])
        keys = 0
        while True:
            (n,) = operations.run("prune_unique_keys", {"batch": batch}, fetch="one")
            keys += n
            if n < batch:
                break
        # The durable records and signals of jobs gone (docs/durable.md).
        records = 0
        while True:
            (n,) = operations.run("prune_orphan_steps", {"batch": batch}, fetch="one")
            records += n
            if not n:
                break
        (workers,) = operations.run("prune_workers", {"cutoff": cutoff}, fetch="one")
        (events,) = operations.run("prune_shard_events", {"cutoff": cutoff}, fetch="one")
        if records:
            self.stdout.write(f"deleted {records} durable records and signals of jobs that no longer exist")
        self.stdout.write(
            f"deleted {deleted} jobs ({' and '.join(statuses)}, finished before "
            f"{cutoff:%Y-%m-%d %H:%M:%S %Z}), {keys} expired unique keys, {workers} worker rows, "
            f"{events} shard events in {time.monotonic() - began:.1f}s"
        )

    def _drop_history(self, keep_seconds: float, width_seconds: int) -> None:
        """Drop the history partitions wholly past ``keep_seconds`` (and make
        the ones ahead), as the archiver does at its passes."""
        store = WorkerStore(application_name="shardq-prune")
        try:
            began = time.monotonic()
            _, dropped = store.maintain_history(keep_seconds, width_seconds, ahead_seconds=2 * width_seconds)
        finally:
            store.close()
        self.stdout.write(
            f"dropped {len(dropped)} history partitions"
            + (f" ({', '.join(dropped)})" if dropped else "")
            + f" in {time.monotonic() - began:.2f}s"
        )

    def _prune_jobs(self, statuses, cutoff, batch, prunable, first_id, last_id, quiet) -> int:
        """Walk ids up to the last job enqueued before the cutoff (a job
        enqueued later finished later too); one autocommit statement a batch."""
        if not prunable or first_id is None or last_id is None:
            return 0
        progress = Progress(
            TextColumn("pruning jobs"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
            disable=quiet,
        )
        bar = progress.add_task("prune", total=prunable)
        deleted, after = 0, first_id - 1
        with progress:
            while after < last_id:
                last_seen, seen, gone = operations.run(
                    "prune_jobs", {"after": after, "batch": batch, "statuses": statuses, "cutoff": cutoff}, fetch="one"
                )
                if not seen:
                    break
                after = last_seen
                deleted += gone
                progress.advance(bar, gone)
        return deleted
