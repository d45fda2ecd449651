"""Fetcher and listener: claim jobs of held shards when there are free slots.

Demand-driven: the fetcher asks for at most ``demand()`` jobs — the worker's
in-flight target (its concurrency plus a look-ahead sized from the measured
task duration, see ``Worker.demand``) minus what is buffered or processing —,
in one statement over every fetchable shard (a per-shard index range walk,
see ``claim_jobs`` in queries.sql) that takes the highest priority level due
across them first, rotating the shard order so no shard starves within a
level when demand is small. It sleeps until woken by a NOTIFY for a shard
this worker holds, by free slots appearing after the buffer was full, or by
the poll interval (the fallback that covers a lost LISTEN connection or a
dropped notification).
"""

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from django.tasks.base import TASK_MAX_PRIORITY as MAX_PRIORITY
from django.tasks.base import TASK_MIN_PRIORITY as MIN_PRIORITY

from ..db.queries import ANY_PRIORITY
from ..db.store import WorkerStore, connect, listen
from ..exceptions import DatabaseUnavailable, StatementRejected
from .buffer import Buffer
from .completer import Completer
from .handback import HandBack
from .jobs import STARTED_BY_CLAIM, ClaimedJob, Outcome
from .leaser import LEASE_CHANNEL, Leaser
from .limits import SCAN_FACTOR
from .service import Service
from .stats import Stats

if TYPE_CHECKING:
    from ..metrics import Metrics
    from .limits import Limiter

# shardq.cancel() announces a cancelled RUNNING job here (cancel_jobs in queries.sql).
CANCEL_CHANNEL = "shardq_cancel"

logger = logging.getLogger("shardq.worker.fetcher")

# Jobs due within this many seconds are claimed now and wait in the local
# queue's time index, so a deferred job starts on time, not a poll later.
LOOKAHEAD_SECONDS = 0.5


class Fetcher(Service):
    name = "fetcher"

    def __init__(
        self,
        store: WorkerStore,
        leaser: Leaser,
        buffer: Buffer,
        completer: Completer,
        stats: Stats,
        *,
        worker_id: str,
        queues: list[str] | None,
        poll_interval_seconds: float,
        demand: Callable[[], tuple[int, int]],
        start_now: Callable[[], int] | None = None,
        outranking_claim: Callable[[int], "OutrankingClaim | None"] | None = None,
        outranking_store: WorkerStore | None = None,
        exclude_queues: list[str] | None = None,
        backend: str | None = None,
        holds: Callable[[int], bool] | None = None,
        metrics: "Metrics | None" = None,
        expedite: Callable[[int], None] | None = None,
        handback: HandBack,
        limiter: "Limiter | None" = None,
        idle_threads: Callable[[], int] | None = None,
        lease_ttl_seconds: float = 30.0,
        limit_channel: str = "shardq_limit",
    ) -> None:
        super().__init__()
        self.store = store
        self.metrics = metrics
        self.leaser = leaser
        self.buffer = buffer
        self.stats = stats
        self.worker_id = worker_id
        self.queues = queues
        self.exclude_queues = exclude_queues  # every queue but these (with queues None)
        self.backend = backend  # claim only this TASKS alias's jobs (None: any)
        self.poll_interval = poll_interval_seconds
        self.demand = demand  # () -> (jobs wanted now, smallest batch worth a claim)
        # () -> how many of a claim's jobs to start in the claim itself: the
        # ones the threads run next (see claim_jobs in queries.sql).
        self.start_now = start_now or (lambda: 0)
        # (a priority NOTIFY told of) -> the claim outside demand that takes
        # jobs outranking one waiting here, or None (see outrank).
        self.outranking_claim = outranking_claim or (lambda priority: None)
        # Those claims run on the listener's thread, on a connection of their
        # own: a NOTIFY does not wait for an ordinary claim in flight (tens of
        # milliseconds for hundreds of rows on a loaded machine, measured).
        self.outranking_store = outranking_store
        # Held by an outranking claim from its statement until its jobs are
        # in the buffer, and by recover_lost_claims: jobs that claim
        # committed are not yet in memory, and must not be taken for lost.
        self._outranking = threading.Lock()
        self.completer = completer  # recalled results are written through it
        self.handback = handback  # claimed jobs this worker will not run go back through it
        self.waiting_for_slots = False
        self._wake = threading.Event()
        # The highest priority NOTIFY told of since the fetcher last looked
        # (None: none); the listener writes it, the fetcher takes it.
        self._notified: int | None = None
        self._notified_lock = threading.Lock()
        self._rotation = 0
        self._deep = False
        # The lowest priority of the last ordinary claim, and the same while
        # the next one is in flight (None otherwise): the jobs on their way
        # here, which a NOTIFY's priority must outrank (see
        # Worker.outranking_claim). Claims go level by level, highest first,
        # so the next one brings no better, unless something new came.
        self._last_lowest: int | None = None
        self.in_flight_lowest: int | None = None
        self.claim_uncertain = False
        # job id -> is it in memory here (buffered, running, outcome unwritten)?
        self.holds = holds or (lambda job_id: False)
        # (best priority of a claim) -> None: jobs that outrank the ones
        # already started here start out of turn (Starter.expedite).
        self.expedite = expedite or (lambda priority: None)
        # Concurrency and rate limits (docs/limits.md): None when this
        # process defines none, and then nothing below runs.
        self.limiter = limiter
        self.idle_threads = idle_threads or (lambda: 0)
        self.lease_ttl = lease_ttl_seconds
        self.limit_channel = limit_channel
        # The last claim_jobs found nothing (and when it ran), and no NOTIFY
        # of new jobs came since: see plain_claim_due.
        self._plain_empty = False
        self._plain_checked = -math.inf
        self._plain_unknown = True
        self._limited_took = False

    def interrupt(self) -> None:
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def jobs_notified(self) -> None:
        """A NOTIFY told of new jobs in a shard held here (of any kind)."""
        self._plain_unknown = True

    def plain_claim_due(self, limited: bool) -> bool:
        """Run the ordinary claim (claim_jobs) this round? Always, unless
        the last round's limited claim brought jobs and the last ordinary
        claim found nothing, with no NOTIFY of new jobs since and less than
        half the look-ahead ago (so a deferred job is still claimed before
        it is due): a drain of limited jobs then pays no empty claim_jobs a
        round (a quarter of its fetcher's time, profiled), and a job of
        another task waits at most that for its claim when no NOTIFY comes."""
        if not limited or not self._limited_took or self._plain_unknown or not self._plain_empty:
            return True
        return time.monotonic() >= self._plain_checked + min(self.poll_interval, LOOKAHEAD_SECONDS / 2)

    def notified(self, priority: int) -> None:
        """A NOTIFY told of a job of ``priority`` in a shard held here."""
        with self._notified_lock:
            if self._notified is None or priority > self._notified:
                self._notified = priority

    def take_notified(self) -> int | None:
        """The highest priority told of since the last call (None: none)."""
        with self._notified_lock:
            priority, self._notified = self._notified, None
            return priority

    def slot_freed(self) -> None:
        """Called by executors after a job: wake the fetcher if it waits for room."""
        if self.waiting_for_slots:
            wanted, min_batch = self.demand()
            if wanted < min_batch:
                return
            self.waiting_for_slots = False
            self._wake.set()

    def run(self) -> None:
        while not self.stopping:
            self._wake.clear()
            claimed = self.fetch_once()
            if claimed is None:
                continue  # got a full batch: there is probably more
            self._wake.wait(claimed)

    def fetch_once(self) -> float | None:
        """Claim one batch. Returns how long to sleep, or None to go again at once."""
        limited = self.limiter is not None and self.limiter.active()
        if limited:
            self.keep_limit_slots()
        free, min_batch = self.demand()
        if free < min_batch and self.buffer.buffered + self.buffer.processing > 0:
            self.waiting_for_slots = True
            return self.poll_interval
        # A claim holds the read side of the leaser's ownership lock from
        # choosing its shards until its jobs are in the buffer. The leaser
        # drops a shard (self-fence, or the start of a drain) under the write
        # side, so a drop never falls between a claim committing jobs of that
        # shard and those jobs reaching the buffer, where they would escape
        # the drop and the shard could be released with them still claimed.
        # Writer priority lets the leaser in between two back-to-back claims.
        ownership = self.leaser.ownership
        ownership.acquire_read()
        try:
            shards = self.leaser.fetchable()
            if not shards or free <= 0:
                return self.poll_interval
            if self.claim_uncertain:
                try:
                    self.recover_lost_claims(sorted(shards))
                except DatabaseUnavailable:
                    return min(self.poll_interval, 0.5)
            order = sorted(shards)
            start = self._rotation % len(order)
            self._rotation += 1
            order = order[start:] + order[:start]
            # The claim takes the highest priority level due over all these
            # shards (see claim_jobs); a shallow pass takes a few jobs of it
            # from every shard that has it. After a short answer (the level
            # ran out, or lives in a few shards) the next claim goes at once,
            # and a deep pass lets any shard fill the batch, so a backlog in a
            # few shards drains at full speed.
            per_shard = free if self._deep else max(1, math.ceil(2 * free / len(order)))
            self.in_flight_lowest = self._last_lowest
            rows: list[ClaimedJob] = []
            try:
                if self.plain_claim_due(limited):
                    self._plain_unknown = False
                    checked = time.monotonic()
                    claimed = self._claim(order, per_shard, free, self.start_now())
                    if not isinstance(claimed, list):
                        self._plain_unknown = True  # failed: look again next round
                        return claimed
                    rows = claimed
                    self._plain_empty, self._plain_checked = not rows, checked
                if rows:
                    self._last_lowest = min(job.priority for job in rows)
                    self.take(rows)
            finally:
                self.in_flight_lowest = None
            # Limited jobs have their own claim (claim_jobs leaves them out),
            # for the demand the ordinary claim left.
            took_limited = self.claim_limited(order, free - len(rows)) if limited else 0
            self._limited_took = took_limited > 0
        finally:
            ownership.release_read()
        if limited:
            # Slots the claim found nothing here needs go back now, not after
            # this round's sleep: another worker may be waiting for them.
            self.keep_limit_slots(renew=False)
        if took_limited:
            return None
        # Fewer rows than asked does not mean empty (per-shard limits, SKIP
        # LOCKED): go again while a claim finds anything; sleep only on none.
        if rows:
            self._deep = len(rows) < free
            return None
        if self._deep:
            self._deep = False
            return None
        # Idle: sleep until the poll, or until the next deferred job comes
        # within the look-ahead (no NOTIFY marks that moment).
        try:
            due_in = self.store.seconds_until_due(order)
        except DatabaseUnavailable:
            return self.poll_interval
        sleep = self.poll_interval
        if limited and self.limiter is not None:
            # A rate limit passed over has its next token at a known time.
            wake_in = self.limiter.wake_in()
            if wake_in is not None:
                sleep = min(sleep, wake_in)
        if due_in is None:
            return sleep
        return max(0.0, min(sleep, due_in - LOOKAHEAD_SECONDS / 2))

    def _claim(
        self,
        order: list[int],
        per_shard: int,
        limit: int,
        start: int,
        min_priority: int = ANY_PRIORITY,
        store: WorkerStore | None = None,
    ) -> list[ClaimedJob] | float:
        """One claim_jobs over the shards in ``order`` (on ``store``, by
        default the fetcher's): its rows, or how long to wait when it
        failed. The caller holds the ownership read lock."""
        began = time.monotonic()
        try:
            rows = (store or self.store).claim_jobs(
                self.worker_id,
                order,
                self.queues,
                per_shard,
                limit,
                lookahead=LOOKAHEAD_SECONDS,
                row_factory=ClaimedJob,
                start=start,
                exclude_queues=self.exclude_queues,
                backend=self.backend,
                pool=self.leaser.pool,
                min_priority=min_priority,
                full_keys=self.buffer.full_keys() if self.buffer.held_back else None,
                key_rooms=self.buffer.key_rooms() if start else None,
            )
        except DatabaseUnavailable as exc:
            # The claim may have committed with its answer lost: its jobs
            # would sit CLAIMED under our current fence with nobody running
            # them. Look for them once the database answers again.
            self.claim_uncertain = True
            self.stats.add("db_errors")
            logger.warning("claim failed, retrying: %s", exc)
            return min(self.poll_interval, 0.5)
        except StatementRejected as exc:
            # A row the claim's quarantine did not foresee: the statement
            # fails whole. Keep the worker (other shards' jobs are fine);
            # try again after the poll interval, loudly.
            self.stats.add("claim_errors")
            logger.error("claim refused by PostgreSQL, retrying after %.1fs: %s", self.poll_interval, exc)
            return self.poll_interval
        self.stats.add("claim_statements")
        if self.metrics is not None:
            self.metrics.claimed(time.monotonic() - began, len(rows))
        return rows

    # -- limits (docs/limits.md) -------------------------------------------------

    def claim_limited(self, order: list[int], wanted: int) -> int:
        """Claim limited jobs for up to ``wanted`` of the demand: first into
        the slots this worker owns, in one statement (``claim_limited_owned``);
        then, when that came back short and more may come of it
        (``Limiter.full_claim_due``), the full claim, which takes slots and
        tokens in the same transaction (Limiter.claim). The
        caller holds the ownership read lock. Returns how many were claimed."""
        limiter = self.limiter
        if limiter is None or wanted <= 0:
            return 0
        took = 0
        limiter.claim_begun()
        try:
            rooms = limiter.owned_rooms()
            if rooms:
                took = self.claim_limited_owned(order, wanted, rooms)
                if took >= wanted or not limiter.full_claim_due():
                    return took
            return took + self.claim_limited_full(order, wanted - took)
        finally:
            limiter.claim_ended()

    def claim_limited_owned(self, order: list[int], wanted: int, rooms: dict[str, int]) -> int:
        limiter = self.limiter
        assert limiter is not None
        try:
            rows = self.store.claim_limited_owned(
                worker=self.worker_id,
                shards=order,
                pool=self.leaser.pool,
                queues=self.queues,
                exclude_queues=self.exclude_queues,
                backend=self.backend,
                per_shard=max(1, math.ceil(SCAN_FACTOR * wanted / len(order))),
                rooms=rooms,
                limit=wanted,
                start=min(wanted, self.start_now()),
                row_factory=ClaimedJob,
            )
        except (DatabaseUnavailable, StatementRejected) as exc:
            return self.limited_claim_failed(exc)
        limiter.claimed_owned(rows, rooms, wanted)
        if rows:
            self.take(rows)
        return len(rows)

    def limited_claim_failed(self, exc: DatabaseUnavailable | StatementRejected) -> int:
        """Count and log a limited claim that did not happen; 0 jobs claimed.
        A lost answer (DatabaseUnavailable) leaves the claim uncertain: its
        jobs and slots committed or not together, and CLAIMED jobs it may
        have left are handed back by the lost-claim sweep, slots freed by the
        next renewal (their jobs are not in memory here)."""
        if isinstance(exc, DatabaseUnavailable):
            self.claim_uncertain = True
            self.stats.add("db_errors")
            logger.warning("limited claim failed, retrying: %s", exc)
        else:
            self.stats.add("claim_errors")
            logger.error("limited claim refused by PostgreSQL, retrying at the next poll: %s", exc)
        return 0

    def claim_limited_full(self, order: list[int], wanted: int) -> int:
        limiter = self.limiter
        assert limiter is not None
        try:
            rows, plan = limiter.claim(
                self.store,
                worker=self.worker_id,
                shards=order,
                pool=self.leaser.pool,
                queues=self.queues,
                exclude_queues=self.exclude_queues,
                backend=self.backend,
                # A shallow walk of every shard (the outer LIMIT comes after
                # each shard's walk has locked its rows); the fetcher goes
                # again at once while claims bring jobs.
                per_shard=max(1, math.ceil(SCAN_FACTOR * wanted / len(order))),
                scan=math.ceil(wanted * SCAN_FACTOR),
                idle_threads=min(wanted, self.idle_threads()),
                ttl=self.lease_ttl,
                row_factory=ClaimedJob,
                limit=wanted,
                start=min(wanted, self.start_now()),
            )
        except (DatabaseUnavailable, StatementRejected) as exc:
            return self.limited_claim_failed(exc)
        if plan is None:
            return 0
        limiter.claimed(plan, {job.id for job in rows})
        if rows:
            self.take(rows)
        return len(rows)

    def keep_limit_slots(self, renew: bool = True) -> None:
        """Give back the slots nothing here needs any more, and renew the
        rest once per half heartbeat (their lease is LEASE_TTL). With
        ``renew`` False (right after a claim): only write the releases."""
        limiter = self.limiter
        if limiter is None:
            return
        if renew:
            limiter.forget_gone(self.holds)
        released = limiter.take_released()
        if not released and not renew:
            return
        try:
            if released:
                self.store.release_limit_slots(self.worker_id, released, self.limit_channel)
            if renew and limiter.renew_due():
                self.store.renew_limit_slots(self.worker_id, limiter.to_renew(self.holds), self.lease_ttl)
        except (DatabaseUnavailable, StatementRejected) as exc:
            # Unwritten releases are the renewal's to free (it frees every
            # slot of this worker whose job is no longer here); a slot that
            # is never renewed expires with its lease.
            self.stats.add("db_errors")
            logger.warning("could not write limit slot releases: %s", exc)
            limiter.requeue_renewal()

    def outrank(self) -> None:
        """Claim the jobs NOTIFY told of (``notified``) that outrank a job
        waiting in this worker's memory, now, outside demand (the
        listener's thread calls it; see claim_outranking)."""
        while (priority := self.take_notified()) is not None:
            claim = self.outranking_claim(priority)
            if claim is None or self.claim_outranking(claim) < claim.limit:
                return
            # A full batch: there may be more (the buffer's room bounds this).
            self.notified(priority)

    def claim_outranking(self, claim: "OutrankingClaim") -> int:
        """Claim, outside demand, up to ``claim.limit`` jobs of at least
        ``claim.min_priority``: jobs that outrank one waiting in this
        worker's memory, which a NOTIFY told of. An ordinary claim would
        come only once a quarter of the look-ahead has run, and its jobs
        would wait behind those started ahead. These may exceed the demand
        by ``limit`` (the buffer keeps that room, see
        Worker.outranking_claim), are started by the claim when the starter
        keeps jobs started ahead, and overtake those (Starter.expedite).
        Runs on ``outranking_store``. Returns how many were claimed."""
        if self.claim_uncertain or self.outranking_store is None:
            return 0  # the ordinary claim looks for lost claims first
        ownership = self.leaser.ownership
        ownership.acquire_read()
        try:
            shards = self.leaser.fetchable()
            if not shards:
                return 0
            with self._outranking:
                return self._claim_outranking(claim, shards)
        finally:
            ownership.release_read()

    def _claim_outranking(self, claim: "OutrankingClaim", shards: dict[int, int]) -> int:
        if self.claim_uncertain:
            return 0  # set while this waited for the lock
        order = sorted(shards)
        start = self._rotation % len(order)
        self._rotation += 1
        order = order[start:] + order[:start]
        rows = self._claim(
            order, claim.limit, claim.limit, claim.start, claim.min_priority, store=self.outranking_store
        )
        if not isinstance(rows, list):
            self._wake.set()  # the fetcher's thread looks for lost claims now
            return 0
        self.stats.add("outranking_claims")
        if rows:
            self.take(rows)
        return len(rows)

    def take(self, rows: list[ClaimedJob]) -> None:
        """Route the jobs of one claim: to the buffer, or back, or straight to
        the completer when this worker already ran them."""
        jobs = []
        for job in rows:
            if job.problem is not None:
                # Quarantined by the claim itself (the row domain): FAILED
                # with an UnreadableJob error; the rest of the claim goes on.
                self.stats.add("quarantined")
                logger.error("job %s (%s) quarantined: %s", job.id, job.task_path, job.problem)
                continue
            if job.started:
                # worker_ids_json as returned already ends with this worker.
                job.start_verdict = STARTED_BY_CLAIM
            jobs.append(job)
        self.stats.add("claimed", len(jobs))
        refused = []
        held = self.leaser.held
        if any(held.get(job.shard) != job.fence for job in jobs):
            # The leaser stopped waiting for this claim (a database that hung
            # past the trust deadline) and dropped shards meanwhile: their
            # jobs must not run here.
            refused = [job for job in jobs if held.get(job.shard) != job.fence]
            jobs = [job for job in jobs if held.get(job.shard) == job.fence]
        remembered = self.completer.remembered.recall([job.id for job in jobs])
        # Only a claim that follows the remembered attempt (no start since):
        # an operator's retry (attempts reset to 0) of a job cancelled mid-run
        # asks for a new run.
        remembered = {
            job.id: remembered[job.id]
            for job in jobs
            if job.id in remembered and job.attempts - job.started == remembered[job.id].attempts
        }
        if remembered:
            # Finished here under an earlier claim whose write was rejected
            # (the lease lapsed, the job was rescued and is claimed again):
            # write the same result under this claim instead of running the
            # task twice. Nobody else has an outcome for it, or it would not
            # have been READY to claim.
            for job in jobs:
                if job.id in remembered:
                    self.completer.put(
                        Outcome(
                            job.id,
                            job.fence,
                            job.status_rank + 1,
                            "SUCCESSFUL",
                            return_value_json=remembered[job.id].return_value_json,
                            shard=job.shard,
                            attempts=job.attempts,
                            job=job,
                        )
                    )
            self.stats.add("recalled", len(remembered))
            logger.info(
                "%s reclaimed jobs had already run here; writing their results "
                "under the new claim instead of running them again",
                len(remembered),
            )
            jobs = [job for job in jobs if job.id not in remembered]
        refused += self.buffer.push_many(jobs)
        if refused:
            self.handback.return_jobs(refused)
        if jobs:
            self.expedite(max(job.priority for job in jobs))

    def recover_lost_claims(self, shards: list[int]) -> int:
        """Hand back jobs claimed by this worker under a current fence that
        are nowhere in its memory (a claim whose answer never arrived)."""
        with self._outranking:
            rows = self.store.my_claimed_jobs(self.worker_id, shards)
            self.claim_uncertain = False
        lost = [
            LostClaim(row["id"], row["fence"], row["status_rank"], row["shard"], row["started"])
            for row in rows
            if not self.holds(row["id"])
        ]
        if lost:
            logger.warning("%s jobs were claimed by a claim whose answer was lost; handing them back", len(lost))
            self.handback.return_jobs(lost)
        return len(lost)


@dataclass(frozen=True, slots=True)
class OutrankingClaim:
    """A claim outside demand (``Fetcher.claim_outranking``): up to ``limit``
    jobs of ``min_priority`` or more, the first ``start`` of them started."""

    min_priority: int
    limit: int
    start: int


@dataclass(slots=True)
class LostClaim:
    """Enough of a claimed job to hand it back (``return_jobs``)."""

    id: int
    fence: int
    status_rank: int
    shard: int
    started: bool = False  # started by that claim: the start is taken back too
    previous_attempt_at: None = None  # not known: return_jobs keeps the time written


def parse_notify(payload: str, shard_count: int) -> tuple[int, int | None] | None:
    """An enqueue NOTIFY payload as (shard, priority), strictly, or None.

    ``shard:priority`` (what enqueue, bulk enqueue and the admin's Retry
    send) or a plain ``shard`` (older senders; priority None): the shard is
    ASCII digits of a shard that exists, the priority an optional minus and
    one to three ASCII digits within Django's -100..100. Anything else is
    None. Any database login can NOTIFY this channel, so the payload is
    untrusted input ('²'.isdigit() is true, int('²') raises) and a priority
    only ever asks for one more claim (rate limited, see Listener).
    """
    shard_text, colon, priority_text = payload.partition(":")
    if not (0 < len(shard_text) <= 5 and shard_text.isascii() and shard_text.isdigit()):
        return None
    shard = int(shard_text)
    if shard >= shard_count:
        return None
    if not colon:
        return shard, None
    digits = priority_text.removeprefix("-")
    if not (0 < len(digits) <= 3 and digits.isascii() and digits.isdigit()):
        return None
    priority = -int(digits) if len(digits) < len(priority_text) else int(digits)
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return None
    return shard, priority


class WakeLimiter:
    """At most one wake-up per ``interval`` seconds; a wake-up asked for
    within the interval is delivered once when it ends (``due``), so a flood
    of NOTIFYs costs a bounded number of statements and none is lost."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.last = -math.inf
        self.pending = False

    def ask(self) -> bool:
        """True: wake now. False: suppressed (delivered by ``due`` later)."""
        now = self.clock()
        if now - self.last >= self.interval:
            self.last, self.pending = now, False
            return True
        self.pending = True
        return False

    def due(self) -> bool:
        """A suppressed wake-up whose interval has ended: deliver it now."""
        if self.pending and self.clock() - self.last >= self.interval:
            self.last, self.pending = self.clock(), False
            return True
        return False


class Listener(Service):
    """LISTEN for enqueue and lease notifications; reconnects when the connection drops.

    Payloads are parsed strictly (``parse_notify``) and wake-ups are rate
    limited (``WakeLimiter``): the fetcher at most every FETCH_WAKE_SECONDS
    per burst, the leaser (one heartbeat each) at most every
    LEASE_WAKE_SECONDS. A payload's priority that outranks a job waiting in
    this worker's memory is claimed here, on this thread (``Fetcher.outrank``:
    one claim at a time, at most one every OUTRANK_SECONDS), so a spoofed
    flood of them costs a bounded number of claims too. Anything else that goes wrong stops the thread with
    ``failure`` set, and the worker stops loudly.
    """

    FETCH_WAKE_SECONDS = 0.002
    # A joining worker is woken by the release that gives it its share: a
    # wake held back 250 ms (as this was) left those shards unowned as long.
    LEASE_WAKE_SECONDS = 0.05
    OUTRANK_SECONDS = 0.005
    name = "listener"

    def __init__(
        self,
        channel: str,
        leaser: Leaser,
        fetcher: Fetcher,
        stats: Stats,
        alias: str = "default",
        shard_count: int = 64,
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.channel = channel
        # shardq.cancel() of a running job: its id, for run control (runcontrol.py).
        self.on_cancel = on_cancel
        self.leaser = leaser
        self.fetcher = fetcher
        self.stats = stats
        self.alias = alias
        self.shard_count = shard_count
        self.conn: psycopg.Connection | None = None
        self.backend_pid: int | None = None
        self.fetch_wakes = WakeLimiter(self.FETCH_WAKE_SECONDS)
        self.lease_wakes = WakeLimiter(self.LEASE_WAKE_SECONDS)
        self.outranks = WakeLimiter(self.OUTRANK_SECONDS)
        # Set once the LISTENs are in: the worker announces its join only
        # then, or the release its announcement causes comes before it
        # listens and it takes its share a heartbeat late.
        self.listening = threading.Event()

    def after_stop(self, deadline: float) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # already broken: nothing to close
                pass

    def run(self) -> None:
        self._listen()

    def on_notify(self, channel: str, payload: str) -> None:
        if channel == CANCEL_CHANNEL:
            if self.on_cancel is not None:
                self.on_cancel(payload)  # checked against the table before anyone is told
            return
        if channel == self.fetcher.limit_channel:
            # A slot of limit ``payload`` was freed somewhere: claim now if
            # this worker was passing that limit over (docs/limits.md).
            limiter = self.fetcher.limiter
            if limiter is not None and limiter.freed(payload) and self.fetch_wakes.ask():
                self.fetcher.wake()
            return
        if channel == LEASE_CHANNEL:
            # Our own announcements come back too: they need no lease round
            # (and must not use up the rate limit a peer's release needs).
            if payload == self.leaser.worker_id:
                return
            if self.leaser.wants_shards():
                # Below its share, a peer's release is ours to take: claim at
                # once, not after the limiter's interval (a joiner woke up to
                # 50 ms late for a second batch of released shards, which sat
                # unowned meanwhile). A flood of spoofed notices costs at
                # most back-to-back claim attempts, and only until the share
                # is held.
                self.leaser.wake_to_claim()
            elif self.lease_wakes.ask():
                self.leaser.wake()
            return
        # The cluster's count as the leaser last saw it (a reshard raises it).
        notice = parse_notify(payload, self.leaser.shard_count)
        if notice is None:
            self.stats.add("bad_notifies")
            return
        shard, priority = notice
        if shard in self.leaser.held:
            # New jobs in a held shard: the next round runs the ordinary
            # claim even if its last one found nothing (Fetcher.jobs_notified).
            self.fetcher.jobs_notified()
            if priority is not None:
                # Recorded even when the claim is put off: the one the
                # limiter delivers later takes it.
                self.fetcher.notified(priority)
                if self.outranks.ask():
                    self.fetcher.outrank()
            if self.fetch_wakes.ask():
                self.fetcher.wake()

    def _listen(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            try:
                self.conn = connect(self.alias, application_name="shardq-listener")
                channels = (self.channel, LEASE_CHANNEL, *((CANCEL_CHANNEL,) if self.on_cancel is not None else ()))
                if self.fetcher.limiter is not None:
                    channels = (*channels, self.fetcher.limit_channel)
                listen(self.conn, *channels)
                self.listening.set()
                self.backend_pid = self.conn.info.backend_pid
                delay = 0.1
                # The gap while we were disconnected is covered by the poll.
                self.fetcher.wake()
                while not self._stop.is_set():
                    # Short waits only while a suppressed wake-up is pending.
                    pending = self.fetch_wakes.pending or self.lease_wakes.pending or self.outranks.pending
                    for note in self.conn.notifies(timeout=0.005 if pending else 0.5, stop_after=256):
                        self.on_notify(note.channel, note.payload)
                        if self.outranks.pending and not pending:
                            break  # deliver it on time, not when this wait ends
                    if self.outranks.due():
                        self.fetcher.outrank()
                    if self.fetch_wakes.due():
                        self.fetcher.wake()
                    if self.lease_wakes.due():
                        self.leaser.wake()
            except (DatabaseUnavailable, psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self.stats.add("db_errors")
                logger.info("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                if self.conn is not None:
                    try:
                        self.conn.close()
                    except Exception:  # already broken
                        pass
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
