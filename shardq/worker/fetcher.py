"""The fetcher: claim jobs of held shards when there are free slots.

Demand-driven: the fetcher asks for at most ``demand()`` jobs — the worker's
in-flight target (its concurrency plus a look-ahead sized from the measured
task duration, see ``Worker.demand``) minus what is buffered or processing —,
in one statement over every fetchable shard (a per-shard index range walk,
see ``claim_jobs`` in shardq/db/sql) that takes the highest priority level due
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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.tasks.base import TASK_MAX_PRIORITY as MAX_PRIORITY
from django.tasks.base import TASK_MIN_PRIORITY as MIN_PRIORITY

from ..core.fairround import FairRound
from ..db.queries import ANY_PRIORITY
from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .jobs import ClaimedJob
from .leaser import Leaser
from .limits import SCAN_FACTOR
from .listener import Subscription, WakeLimiter
from .pipeline import OutrankingClaim, Pipeline, PipelineConfig
from .queuecontrol import QueueControls
from .service import Service

if TYPE_CHECKING:
    pass

logger = logging.getLogger("shardq.worker.fetcher")

# Jobs due within this many seconds are claimed now and wait in the local
# queue's time index, so a deferred job starts on time, not a poll later.
LOOKAHEAD_SECONDS = 0.5
# A burst of NOTIFYs wakes the fetcher at most this often, and claims jobs
# that outrank the buffer at most this often (listener.py's WakeLimiter).
FETCH_WAKE_SECONDS = 0.002
OUTRANK_SECONDS = 0.005


class Fetcher(Service):
    name = "fetcher"

    def __init__(
        self,
        config: PipelineConfig,
        pipeline: Pipeline,
        leaser: Leaser,
        store: WorkerStore,
        outranking_store: WorkerStore | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.pipeline = pipeline
        self.store = store
        self.leaser = leaser
        options, settings = config.options, config.settings
        self.worker_id = config.worker_id
        self.queues = options.queues
        # every queue but these (with queues None); the claims leave out the
        # queues the controls block too (exclude_queues, below).
        self._exclude_queues = list(options.exclude_queues or ())
        self.backend = options.backend  # claim only this TASKS alias's jobs (None: any)
        self.poll_interval = settings.poll_interval_seconds
        self.lease_ttl = settings.lease_ttl_seconds
        self.jobs_channel = settings.channel
        self.limit_channel = config.limit_channel
        # Live queue controls (shardq/queues.py): paused queues and
        # concurrency overrides, read from shardq_queue_control.
        self.controls_channel = settings.channel + "_queue"
        self.controls = QueueControls(self.poll_interval)
        self._blocked: list[str] = []
        # What the pipeline gives this stage: the local queue it fills, the
        # hand-back for jobs it will not push, and the limits.
        self.buffer = pipeline.buffer
        self.stats = pipeline.stats
        self.metrics = pipeline.metrics
        self.handback = pipeline.handback
        # Concurrency and rate limits (docs/limits.md): None when this
        # process defines none, and then nothing below runs.
        self.limiter = pipeline.limiter
        self.demand = pipeline.demand  # () -> (jobs wanted now, smallest batch worth a claim)
        self.idle_threads = pipeline.idle_threads
        # job id -> is it in memory here (buffered, running, outcome unwritten)?
        self.holds = pipeline.holds
        # (a priority NOTIFY told of) -> the claim outside demand that takes
        # jobs outranking one waiting here, or None (see outrank).
        self.outranking_claim = pipeline.outranking_claim
        # Those claims run on the listener's thread, on a connection of their
        # own: a NOTIFY does not wait for an ordinary claim in flight (tens of
        # milliseconds for hundreds of rows on a loaded machine, measured).
        self.outranking_store = outranking_store
        # Held by an outranking claim from its statement until its jobs are
        # in the buffer, and by recover_lost_claims: jobs that claim
        # committed are not yet in memory, and must not be taken for lost.
        self._outranking = threading.Lock()
        self._wake = pipeline.fetch_wake
        # The highest priority NOTIFY told of since the fetcher last looked
        # (None: none); the listener writes it, the fetcher takes it.
        self._notified: int | None = None
        self._notified_lock = threading.Lock()
        # Rate limits on what NOTIFYs set off (jobs_notified_by).
        self.fetch_wakes = WakeLimiter(FETCH_WAKE_SECONDS)
        self.outranks = WakeLimiter(OUTRANK_SECONDS)
        self._rotation = 0
        self._deep = False
        # The lowest priority of the last ordinary claim, set in the
        # pipeline while the next one is in flight (pipeline.in_flight_lowest):
        # the jobs on their way here, which a NOTIFY's priority must outrank.
        # Claims go level by level, highest first, so the next one brings no
        # better, unless something new came.
        self._last_lowest: int | None = None
        self.claim_uncertain = False
        # The last claim_jobs found nothing (and when it ran), and no NOTIFY
        # of new jobs came since: see plain_claim_due.
        self._plain_empty = False
        self._plain_checked = -math.inf
        self._plain_unknown = True
        self._limited_took = False
        # Quiet (told_shards): the held shards (shard -> fence) when a claim
        # over all of them found nothing, until when no claim over all of
        # them is due, and the shards NOTIFYs told of since.
        self._quiet: dict[int, int] | None = None
        self._quiet_until = -math.inf
        self._told: set[int] = set()
        # Fairness (docs/fairness.md): the round's turn, whether the claim
        # goes by it, and the weights it shares out by (FairRound). Keys the
        # claim passes over wake the fetcher when they run low
        # (Buffer.fair_room).
        self.fair_round = FairRound()

    def interrupt(self) -> None:
        self._wake.set()

    @property
    def exclude_queues(self) -> list[str] | None:
        """Queues no claim of this round may take: --exclude-queues, and the
        queues paused or at their concurrency override (apply_controls)."""
        blocked = self._blocked
        if not blocked:
            return self._exclude_queues or None
        return [*self._exclude_queues, *blocked]

    def controls_notified(self, payload: str) -> None:
        """A NOTIFY on <CHANNEL>_queue: an operator changed a queue's
        controls. Read them now (the fetcher's thread does)."""
        self.controls.notified(payload)
        self.wake()

    def apply_controls(self) -> None:
        """Read the queue controls when a NOTIFY asked or a poll interval
        passed, hand back the buffered jobs of a queue newly paused, and
        set the queues this round's claims leave out."""
        controls = self.controls
        if controls.refresh_due():
            controls.begin_load()
            try:
                rows = self.store.queue_controls()
            except (DatabaseUnavailable, StatementRejected) as exc:
                controls.load_failed()
                self.stats.add("db_errors")
                logger.warning("could not read the queue controls, keeping the last ones: %s", exc)
                rows = None
            if rows is not None:
                newly = controls.load(rows)
                if newly:
                    dropped = self.buffer.drop_queues(newly)
                    if dropped:
                        logger.info(
                            "queues %s paused: handing back %s claimed jobs not started",
                            ", ".join(sorted(newly)),
                            len(dropped),
                        )
                        self.stats.add("paused_handed_back", len(dropped))
                        self.handback.return_jobs(dropped)
                    self.pipeline.slot_freed()
        self._blocked = controls.blocked(self.buffer.held_by_queue)
        # A job of a queue at its override leaving this worker wakes the
        # fetcher (Pipeline.slot_freed): there is room for the next.
        self.pipeline.capped_blocked = frozenset(q for q in self._blocked if q in controls.caps)

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

    # -- notifications (the worker subscribes these, listener.py) ---------------

    def subscriptions(self) -> dict[str, Subscription]:
        """This fetcher's channels: new jobs, and freed limit slots when
        this process defines limits."""
        jobs = Subscription(self.jobs_notified_by, self._notices_pending, self._flush_notices)
        channels = {self.jobs_channel: jobs, self.controls_channel: Subscription(self.controls_notified)}
        if self.limiter is not None:
            channels[self.limit_channel] = Subscription(self.limit_freed)
        return channels

    def jobs_notified_by(self, payload: str) -> None:
        """An enqueue's NOTIFY, ``shard:priority``: parsed strictly (any
        database login can send one), and it wakes this fetcher at most every
        FETCH_WAKE_SECONDS per burst; a priority that outranks a job waiting
        here is claimed at once on the listener's thread (``outrank``: one
        claim at a time, at most one every OUTRANK_SECONDS), so a spoofed
        flood of them costs a bounded number of claims too."""
        # The cluster's count as the leaser last saw it (a reshard raises it).
        notice = parse_notify(payload, self.leaser.shard_count)
        if notice is None:
            self.stats.add("bad_notifies")
            return
        shard, priority = notice
        if shard not in self.leaser.held:
            return
        # New jobs in a held shard: the next round runs the ordinary claim
        # even if its last one found nothing (jobs_notified), over this
        # shard at least (FetchWake.notified).
        self.jobs_notified()
        self._wake.notified(shard)
        if priority is not None:
            # Recorded even when the claim is put off: the one the limiter
            # delivers later takes it.
            self.notified(priority)
            if self.outranks.ask():
                self.outrank()
        if self.fetch_wakes.ask():
            self._wake.wake()

    def limit_freed(self, payload: str) -> None:
        """A slot of limit ``payload`` was freed somewhere: claim now if this
        worker was passing that limit over (docs/limits.md)."""
        limiter = self.limiter
        if limiter is not None and limiter.freed(payload):
            self._wake.want_full()
            if self.fetch_wakes.ask():
                self._wake.wake()

    def _notices_pending(self) -> bool:
        return self.fetch_wakes.pending or self.outranks.pending

    def _flush_notices(self) -> None:
        if self.outranks.due():
            self.outrank()
        if self.fetch_wakes.due():
            self._wake.wake()

    @property
    def waiting_for_slots(self) -> bool:
        """Does the fetcher wait for room (``Pipeline.slot_freed`` wakes it)?"""
        return self.pipeline.waiting_for_slots

    def run(self) -> None:
        while not self.stopping:
            self._wake.clear()
            claimed = self.fetch_once()
            if claimed is None:
                continue  # got a full batch: there is probably more
            self._wake.wait(claimed)

    def fetch_once(self) -> float | None:
        """Claim one batch. Returns how long to sleep, or None to go again at once."""
        self.apply_controls()
        limited = self.limiter is not None and self.limiter.active()
        if limited:
            self.keep_limit_slots()
        free, min_batch = self.demand()
        if free < min_batch and self.buffer.buffered + self.buffer.processing > 0:
            self.pipeline.waiting_for_slots = True
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
            told = self.told_shards(shards)
            if told is not None:
                rows, took_limited = self.claim_told(told, order, free, limited)
            else:
                rows, took_limited = self.claim_all(order, free, limited)
        finally:
            ownership.release_read()
        if limited:
            # Slots the claim found nothing here needs go back now, not after
            # this round's sleep: another worker may be waiting for them.
            self.keep_limit_slots(renew=False)
        if not isinstance(rows, list):
            return rows  # the claim failed: wait this long
        if took_limited:
            return None
        if told is not None:
            return self.after_told(told, rows, free, limited)
        # Fewer rows than asked does not mean empty (per-shard limits, SKIP
        # LOCKED): go again while a claim finds anything; sleep only on none.
        if rows:
            self._deep = len(rows) < free
            return None
        if self._deep:
            self._deep = False
            return None
        # Idle: sleep until the poll, or until the next deferred job comes
        # within the look-ahead (no NOTIFY marks that moment). Until then,
        # a NOTIFY's claim walks only the shards told of (told_shards).
        sleep = self.idle_sleep(order, limited)
        self._quiet, self._quiet_until = dict(shards), time.monotonic() + sleep
        return sleep

    def claim_all(self, order: list[int], free: int, limited: bool) -> tuple[list[ClaimedJob] | float, int]:
        """A round over every held shard (``order``): the ordinary claim,
        then the limited one for the demand it left. (its rows, or how long
        to wait when it failed; how many limited jobs were claimed)."""
        # The claim takes the highest priority level due over all these
        # shards (see claim_jobs); a shallow pass takes a few jobs of it
        # from every shard that has it. After a short answer (the level
        # ran out, or lives in a few shards) the next claim goes at once,
        # and a deep pass lets any shard fill the batch, so a backlog in a
        # few shards drains at full speed.
        per_shard = free if self._deep else max(1, math.ceil(2 * free / len(order)))
        rows = self.claim_plain(order, per_shard, free, limited)
        if not isinstance(rows, list):
            return rows, 0
        # Limited jobs have their own claim (claim_jobs leaves them out),
        # for the demand the ordinary claim left.
        took_limited = self.claim_limited(order, free - len(rows)) if limited else 0
        self._limited_took = took_limited > 0
        return rows, took_limited

    # -- quiet: the told shards' claim -------------------------------------------

    def told_shards(self, shards: dict[int, int]) -> list[int] | None:
        """The shards this round claims from when only NOTIFYs of new jobs
        woke the fetcher since a claim over every held shard found nothing
        (quiet): those told of, sorted. None: claim from every shard (the
        poll or a deferred job's due time came, the held shards or their
        fences changed, something else woke it: free room, a queue control,
        a limit slot, a fair key run low (FetchWake.set); or a round was
        asked with nothing told, as a test's direct call)."""
        full, told = self._wake.take()
        quiet = self._quiet
        if quiet is not None and not full and time.monotonic() < self._quiet_until and quiet == shards:
            self._told.update(shard for shard in told if shard in shards)
            if self._told:
                return sorted(self._told)
        self._quiet = None
        self._told.clear()
        return None

    def claim_told(
        self, told: list[int], order: list[int], free: int, limited: bool
    ) -> tuple[list[ClaimedJob] | float, int]:
        """A quiet round: the ordinary claim over the shards NOTIFYs told of
        (``told``), every other held shard having had nothing at the last
        claim over all of them and no NOTIFY since: one index probe a told
        shard, not one a held shard. Limited jobs (their own claim, over
        ``order``: every shard, as a limit's state is decided over all of
        them) are looked for when the told shards had no ordinary job; a
        limited claim that took some ends the quiet."""
        self.stats.add("told_claims")
        rows = self.claim_plain(told, free, free, limited)
        if not isinstance(rows, list):
            return rows, 0
        took_limited = 0
        if not rows and limited:
            took_limited = self.claim_limited(order, free)
            self._limited_took = took_limited > 0
            if took_limited:
                self._quiet = None  # the limited drain goes on over every shard
        return rows, took_limited

    def after_told(self, told: list[int], rows: list[ClaimedJob], free: int, limited: bool) -> float | None:
        """After a quiet round: go again at once while the told shards may
        hold more (several shards, or a full batch: the claim's walk of one
        shard below the batch took all it had due); else sleep until the
        quiet ends, or a deferred job of the told shards comes due."""
        if rows and (len(told) > 1 or len(rows) >= free):
            return None
        self._told.clear()
        now = time.monotonic()
        self._quiet_until = min(self._quiet_until, now + self.idle_sleep(told, limited))
        return max(0.0, self._quiet_until - now)

    def claim_plain(self, order: list[int], per_shard: int, free: int, limited: bool) -> list[ClaimedJob] | float:
        """The ordinary claim of this round (``claim_jobs``) when due, its
        jobs routed (``take``): its rows, or how long to wait when it
        failed. The caller holds the ownership read lock."""
        self.pipeline.in_flight_lowest = self._last_lowest
        rows: list[ClaimedJob] = []
        try:
            if self.plain_claim_due(limited):
                self._plain_unknown = False
                checked = time.monotonic()
                claimed = self._claim(order, per_shard, free)
                if not isinstance(claimed, list):
                    self._plain_unknown = True  # failed: look again next round
                    self._quiet = None
                    return claimed
                rows = claimed
                self._plain_empty, self._plain_checked = not rows, checked
            if rows:
                self._last_lowest = min(job.priority for job in rows)
                self.take(rows)
        finally:
            self.pipeline.in_flight_lowest = None
        return rows

    def idle_sleep(self, order: list[int], limited: bool) -> float:
        """How long an idle fetcher sleeps: the poll interval, or less when a
        deferred job of these shards comes within the look-ahead sooner, or
        a rate limit passed over has its next token sooner."""
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
        min_priority: int = ANY_PRIORITY,
        store: WorkerStore | None = None,
    ) -> list[ClaimedJob] | float:
        """One claim_jobs over the shards in ``order`` (on ``store``, by
        default the fetcher's): its rows, or how long to wait when it
        failed. The caller holds the ownership read lock."""
        began = time.monotonic()
        # Fair keys (docs/fairness.md): one round over the keys after the
        # last one taken; an ordinary claim passes over the keys buffered to
        # their share, a claim of jobs that outrank the buffer does not.
        ordinary = min_priority == ANY_PRIORITY
        full_fair_keys = self.buffer.full_fair_keys(self.pipeline.fair_share()) if ordinary else []
        # Round the keys once a key gathers jobs here, while the round is due
        # (FairRound.due: a key came twice lately, or from the start), and
        # for a claim that outranks the buffer; else a FIFO slice, as cheap
        # as without fair keys.
        walk = bool(full_fair_keys) or self.buffer.fair_crowded or not ordinary or self.fair_round.due
        try:
            rows = (store or self.store).claim_jobs(
                self.worker_id,
                order,
                self.queues,
                per_shard,
                limit,
                lookahead=LOOKAHEAD_SECONDS,
                row_factory=ClaimedJob,
                exclude_queues=self.exclude_queues,
                backend=self.backend,
                pool=self.leaser.pool,
                min_priority=min_priority,
                full_keys=self.buffer.full_keys() if self.buffer.held_back else None,
                fair_after=self.fair_round.after,
                full_fair_keys=full_fair_keys,
                fair_walk=walk,
                fair_weights=self.fair_round.weights,
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
        if ordinary:
            # The fetcher's thread only (an outranking claim runs on the listener's).
            self.fair_turns(rows, walk)
        return rows

    def fair_turns(self, rows: list[ClaimedJob], walked: bool) -> None:
        """Tell the fair round what this claim brought: each fair job's key
        and weight (its own, else the settings')."""
        weight_of = self.buffer.fair_weight
        self.fair_round.claimed(
            (
                (
                    job.fair_key,
                    float(job.fair_weight)
                    if job.fair_weight is not None and job.fair_weight > 0
                    else (weight_of(job.fair_key) if weight_of is not None else 1.0),
                )
                for job in rows
                if job.fair_key is not None
            ),
            walked,
        )

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

    def claim_outranking(self, claim: OutrankingClaim) -> int:
        """Claim, outside demand, up to ``claim.limit`` jobs of at least
        ``claim.min_priority``: jobs that outrank one waiting in this
        worker's memory, which a NOTIFY told of. An ordinary claim would
        come only once a quarter of the look-ahead has run. These may exceed
        the demand by ``limit`` (the buffer keeps that room, see
        Worker.outranking_claim) and go to the next free thread ahead of
        the lower jobs buffered. Runs on ``outranking_store``. Returns how many were claimed."""
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

    def _claim_outranking(self, claim: OutrankingClaim, shards: dict[int, int]) -> int:
        if self.claim_uncertain:
            return 0  # set while this waited for the lock
        order = sorted(shards)
        start = self._rotation % len(order)
        self._rotation += 1
        order = order[start:] + order[:start]
        rows = self._claim(order, claim.limit, claim.limit, claim.min_priority, store=self.outranking_store)
        if not isinstance(rows, list):
            self._wake.set()  # the fetcher's thread looks for lost claims now
            return 0
        self.stats.add("outranking_claims")
        if rows:
            self.take(rows)
        return len(rows)

    def take(self, rows: list[ClaimedJob]) -> None:
        """Route the jobs of one claim: to the buffer, or back. A job this
        worker already ran goes to the buffer with its remembered result as
        its verdict (``recalled``): its thread writes that, runs nothing."""
        jobs = []
        for job in rows:
            if job.problem is not None:
                # Quarantined by the claim itself (the row domain): FAILED
                # with an UnreadableJob error; the rest of the claim goes on.
                self.stats.add("quarantined")
                logger.error("job %s (%s) quarantined: %s", job.id, job.task_path, job.problem)
                continue
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
        caps = self.controls.caps
        if caps and any(job.queue_name in caps for job in jobs):
            jobs, over = self.within_caps(jobs, caps)
            refused += over
        remembered = self.pipeline.remembered.recall([job.id for job in jobs])
        # Only a claim that follows the remembered attempt (no start since):
        # an operator's retry (attempts reset to 0) of a job cancelled mid-run
        # asks for a new run.
        recalled = 0
        for job in jobs:
            outcome = remembered.get(job.id)
            if outcome is not None and job.attempts - job.started == outcome.attempts:
                # Finished here under an earlier claim whose write was
                # rejected (the lease lapsed, the job was rescued and is
                # claimed again): its thread writes the same result under
                # this claim instead of running the task twice (the verdict
                # Executor.execute reads). Nobody else has an outcome for
                # it, or it would not have been READY to claim.
                job.recalled = outcome.return_value_json or "null"
                recalled += 1
        if recalled:
            self.stats.add("recalled", recalled)
            logger.info(
                "%s reclaimed jobs had already run here; writing their results "
                "under the new claim instead of running them again",
                recalled,
            )
        refused += self.buffer.push_many(jobs)
        if refused:
            self.handback.return_jobs(refused)
        self.pipeline.signals.claimed.signal(jobs)

    def within_caps(self, jobs: list[ClaimedJob], caps: dict[str, int]) -> tuple[list[ClaimedJob], list[ClaimedJob]]:
        """(the jobs to keep, the jobs over a queue's concurrency override,
        to hand back): a claim may bring more of a queue than its room."""
        held = self.buffer.held_by_queue()
        keep, over = [], []
        for job in jobs:
            cap = caps.get(job.queue_name)
            if cap is not None:
                count = held.get(job.queue_name, 0)
                if count >= cap:
                    over.append(job)
                    continue
                held[job.queue_name] = count + 1
            keep.append(job)
        if over:
            self.stats.add("over_queue_concurrency", len(over))
        return keep, over

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
