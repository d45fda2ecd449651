"""``manage.py shardq_reshard --to N``: raise the shard count online.

A job's shard is ``key_hash & (count - 1)`` and the row keeps the full
32-bit ``key_hash``, so raising the count to a larger power of two sends
each job to its old shard or to ``old + k * old_count``: an UPDATE of the
jobs that move, never a rehash. The steps, each safe beside running workers
and enqueuers:

1. **switch** (one transaction): the lease rows of the new shards for every
   pool, and ``shardq_cluster``: ``shard_count = N``, ``reshard_from = old``,
   ``version + 1``, ``switched_at``; a NOTIFY on ``shardq_lease``. Every
   enqueue statement reads the count in SQL, so from the commit on new jobs
   go to their new shards; workers learn the count with their next
   heartbeat (at once, by the NOTIFY) and claim a share of the new shards.
2. **move**: per old shard, batches of its READY jobs that now belong
   elsewhere move (``FOR UPDATE SKIP LOCKED``: a job a claim is taking is
   left to run where it is). Jobs in flight are never moved: their worker
   finishes them under its lease; a retry comes back READY and moves then.
3. **wait**: until no session has a transaction begun before the switch
   (such a transaction may still commit a job placed with the old count),
   then move again, until no unfinished job is out of its shard.
4. **finish**: ``reshard_from = NULL``, ``version + 1``.

Per-key order: while ``reshard_from`` is set, the claim checks an ordered
job's predecessors across its shard's whole family (every shard equal to it
below the old count), whoever owns them; so a key's jobs split between its
old and new shard, or left in the old one by a late transaction, never run
out of order (docs/architecture.md, "Resharding").

One reshard at a time: the command holds a session advisory lock for its
whole run. A reshard whose command died leaves ``reshard_from`` set (the
claim's family check keeps order meanwhile); ``--resume`` finishes it.
"""

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ...conf import get_config
from ...db import operations
from ..flags import printable, whole_number
from ..progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

# The session advisory lock held while a reshard runs ("shrq", 2; the
# metrics lock is ("shrq", 1)).
RESHARD_LOCK = {"classid": 0x73687271, "objid": 2}
# SHARDQ["SHARD_COUNT"]'s range (check shardq.E002); shard is a smallint.
MAX_SHARDS = 16384
MAX_BATCH = 100_000
# How often the wait for old transactions and in-flight jobs looks again.
POLL_SECONDS = 0.2


def parse_target(value: str) -> int:
    count = whole_number("to", value, minimum=1, maximum=MAX_SHARDS)
    if count & (count - 1):
        lower = 1 << (count.bit_length() - 1)
        raise CommandError(
            f"--to {count} is not a power of two: a job's shard is key_hash & (count - 1), so the count "
            f"must be one. Use --to {lower * 2} (or {lower})."
        )
    return count


class Command(BaseCommand):
    help = (
        "Raise the shard count online to a larger power of two (--to N): new jobs go to their new shards "
        "at once, READY jobs move, workers take a share of the new shards; per-key order holds throughout."
    )

    def add_arguments(self, parser):
        parser.add_argument("--to", help=f"The new shard count: a power of two above the current one, ≤ {MAX_SHARDS}.")
        parser.add_argument(
            "--resume",
            action="store_true",
            help="Finish a reshard whose command was interrupted (moves what is left, waits, finishes).",
        )
        parser.add_argument("--batch", default="5000", help=f"Jobs moved per transaction, 1 to {MAX_BATCH}.")
        parser.add_argument("--dry-run", action="store_true", help="Say what the reshard would do; change nothing.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (logs, cron).")

    def handle(self, *args, **options):
        if options["to"] is None and not options["resume"]:
            raise CommandError("Give --to N (the new shard count), or --resume to finish an interrupted reshard.")
        target = parse_target(options["to"]) if options["to"] is not None else None
        self.batch = whole_number("batch", options["batch"], maximum=MAX_BATCH)
        self.quiet = options["no_progress"]
        self.channel = get_config().channel
        row = operations.run("reshard_state", RESHARD_LOCK, fetch="one")
        if row is None:
            raise CommandError("shardq_cluster has no row: run `manage.py migrate` first.")
        count, version, reshard_from, switched_at, locked = row
        try:
            self._handle(target, count, version, reshard_from, switched_at, locked, options)
        finally:
            if locked:
                operations.run("reshard_unlock", RESHARD_LOCK, fetch="one")

    def _handle(self, target, count, version, reshard_from, switched_at, locked, options):
        if reshard_from is not None:
            if not locked:
                raise CommandError(
                    f"A reshard from {reshard_from} to {count} shards is running (switched at "
                    f"{switched_at:%Y-%m-%d %H:%M:%S %Z}); one reshard at a time. Wait for it to finish."
                )
            if not options["resume"]:
                raise CommandError(
                    f"A reshard from {reshard_from} to {count} shards was interrupted (its command stopped before "
                    "it finished; per-key order is still kept). Run `manage.py shardq_reshard --resume` to finish "
                    "it before starting another."
                )
            if target is not None and target != count:
                raise CommandError(
                    f"--resume finishes the reshard from {reshard_from} to {count} shards; --to {target} names "
                    f"another. Run --resume alone, then reshard to {target}."
                )
            if options["dry_run"]:
                self._describe(reshard_from, count, resuming=True)
                return
            self._complete(reshard_from, count, switched_at)
            return
        if options["resume"]:
            raise CommandError(f"No reshard is running (the cluster has {count} shards, version {version}).")
        if not locked:
            raise CommandError("Another shardq_reshard is starting (it holds the reshard lock); one reshard at a time.")
        if target < count:
            raise CommandError(
                f"--to {target} would shrink the cluster from {count} shards; shardq only grows the shard count "
                "(shrinking would merge shards whose jobs are owned by different workers). Choose a power of two "
                f"above {count}."
            )
        if target == count:
            raise CommandError(f"The cluster already has {count} shards; --to must be a larger power of two.")
        if options["dry_run"]:
            self._describe(count, target, resuming=False)
            return
        began = time.monotonic()
        with transaction.atomic():
            switched = operations.run("reshard_switch", {"from": count, "to": target}, fetch="one")
        if switched is None:
            raise CommandError("The cluster's shard count changed while this command started; run it again.")
        new_version, switched_at, _ = switched
        self.stdout.write(
            f"shard count {count} → {target} (version {new_version}): new jobs go to their new shards; "
            "workers take a share of the new shards at their next lease round"
        )
        self._complete(count, target, switched_at, began)

    def _describe(self, old: int, new: int, resuming: bool) -> None:
        moving, in_flight, pools = operations.run("reshard_plan", {"to": new}, fetch="one")
        pools = ", ".join(printable(p) for p in pools or [])
        verb = "would finish the reshard" if resuming else "would raise the shard count"
        self.stdout.write(
            f"{verb} from {old} to {new}: {moving} READY jobs move to their new shards; {in_flight} jobs in "
            f"flight finish where they are; lease rows {old}..{new - 1} are added for pool(s) {pools or '*'}. "
            "Nothing was changed (--dry-run)."
        )

    def _complete(self, old: int, new: int, switched_at, began: float | None = None) -> None:
        began = time.monotonic() if began is None else began
        moved = self._move(new, "moving READY jobs")
        # A transaction begun before the switch may still commit jobs placed
        # with the old count: wait for every one, then move again.
        waiting_since = time.monotonic()
        told = False
        while True:
            pids, hidden = operations.run("reshard_old_transactions", {"switched_at": switched_at}, fetch="one")
            if not pids:
                break
            if not told or time.monotonic() - waiting_since > 10:
                self.stderr.write(
                    f"waiting for {len(pids)} transaction(s) begun before the switch (pids "
                    f"{', '.join(map(str, pids[:10]))}) to end"
                )
                told, waiting_since = True, time.monotonic()
            time.sleep(POLL_SECONDS)
        if hidden:
            self.stderr.write(
                f"warning: {hidden} session(s) of other roles are not visible to this one; a transaction of "
                "theirs begun before the switch cannot be waited for (grant pg_read_all_stats). Jobs such a "
                "transaction commits are still run; only their order against the key's later jobs is at risk."
            )
        # Until nothing unfinished is out of place: READY jobs move, jobs in
        # flight finish (or come back READY and move).
        told_at = 0.0
        while True:
            moved += self._move(new, "moving the rest")
            ready_shards, in_flight = operations.run("reshard_misplaced", {"to": new}, fetch="one")
            if not ready_shards and not in_flight:
                break
            if in_flight and time.monotonic() - told_at > 10:
                self.stderr.write(f"waiting for {in_flight} job(s) in flight in their old shard to finish")
                told_at = time.monotonic()
            time.sleep(POLL_SECONDS)
        (version,) = operations.run("reshard_finish", fetch="one")
        self.stdout.write(
            f"resharded {old} → {new} shards (version {version}): {moved} READY jobs moved in "
            f"{time.monotonic() - began:.1f}s"
        )

    def _move(self, new: int, label: str) -> int:
        """Move every misplaced READY job, shard by shard, in batches; returns how many moved."""
        ready_shards, _ = operations.run("reshard_misplaced", {"to": new}, fetch="one")
        if not ready_shards:
            return 0
        total = operations.run("reshard_plan", {"to": new}, fetch="one")[0]
        progress = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
            disable=self.quiet,
        )
        bar = progress.add_task(label, total=total)
        moved = 0
        with progress:
            for shard in ready_shards:
                while True:
                    n, _ = operations.run(
                        "reshard_move",
                        {"shard": shard, "to": new, "batch": self.batch, "channel": self.channel},
                        fetch="one",
                    )
                    moved += n
                    progress.advance(bar, n)
                    if n < self.batch:
                        break
        return moved
