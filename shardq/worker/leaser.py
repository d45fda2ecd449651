"""The lease protocol (DESIGN §4), one thread per worker process.

State model of a shard, as this worker sees it::

    free ──claim──▶ held ──renewal returns it──▶ held (trust extended)
                     │  └─renewal misses it / deadline passes──▶ fenced (dropped at once)
                     └─above share──▶ draining ──no running job──▶ released

Every ``HEARTBEAT`` seconds the leaser renews exactly the (shard,
claim_version) pairs it holds, records a heartbeat, counts the live workers
(itself included), and moves toward its share: ``SHARD_COUNT // live``, plus
one for the first ``SHARD_COUNT % live`` workers in start order, so 64 shards
over 3 workers settle at exactly 22/21/21. Below its share it claims
unowned or expired shards (a takeover bumps ``claim_version`` and rescues the
previous owner's RUNNING jobs in the same transaction); above it, it drains
every shard above its share at once and releases each as soon as none of its
jobs runs here, then announces the release, so a joining worker holds its
share within milliseconds of registering rather than one shard a tick.

Times that matter for correctness come from the database
(``clock_timestamp()``). Locally the worker trusts its leases only until
``renew_sent + LEASE_TTL - margin`` on its own monotonic clock: past that
deadline nothing new starts (executors check ``trusts()``), and a renewal that
cannot reach the database by then, or that returns fewer shards than sent,
drops those shards at once (self-fencing). The deadline is kept by a watch
thread of its own (``_watch_trust``): on a silent network partition the
leaser thread sits in a statement until the connection's TCP timeout, and
the drop must not wait for it (issue 17 part 2: without the watch, a worker
cut off by the network logged no self-fence for minutes).

Dead-owner detection (docs/reliability.md, "A worker that dies"): a
SIGKILLed worker's sessions vanish from PostgreSQL at once (the server sees
the socket close), long before its leases expire. Every worker records the
server session of this thread's connection (its backend pid and start, the
server's start) with each heartbeat, and between rounds looks every
``DEAD_OWNER_CHECK`` seconds (one small statement) for peers of its pool
whose recorded session is gone from the server. A peer seen gone for two
intervals is dead, or at once when its LISTEN session (recorded the same
way by the listener) is gone too: a whole process gone, not a connection: the round that follows does not count it live (the
shares grow) and claims its shards as if they had expired, the takeover's
new ``claim_version`` fencing it as an expiry does. The two intervals are
for a live worker whose connection dropped: its own check fails, and the
round it runs at once reconnects and records the new session first; if it
loses the race it is fenced like any worker whose lease was taken. Off with
``DEAD_OWNER_DETECTION`` False, or when the worker's alias looks like a
transaction pool (its backend pids mean nothing); a pooler of any kind is
also seen at the heartbeat (the pid the client was told is not the
session's), which then records nothing, so such a worker is never taken for
dead before its leases expire.

Dropping a shard (self-fence, or the start of a drain) takes the write side
of ``ownership``, a read-write lock whose read side each claim holds from
choosing its shards until its jobs are buffered (see ``Fetcher.fetch_once``):
no claim is then half-way, and the drop finds every buffered job of the
shard. The wait is bounded: past ``heartbeat`` seconds (a claim stuck on a
hung database) the drop goes ahead, and the claim hands back whatever it
brings for shards no longer held.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from ..core.rwlock import RWLock
from ..db.store import LEASE_CHANNEL, WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from ..pooling import transaction_pooled
from .listener import Subscription, WakeLimiter
from .logs import shard_ranges
from .pipeline import PipelineConfig
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.leaser")

__all__ = ["LEASE_CHANNEL", "Leaser", "fair_share"]

LEASE_WAKE_SECONDS = 0.05


class ShardHub(Protocol):
    """What the leaser tells of and asks about shards (the worker's Pipeline)."""

    stats: Stats

    def running_in_shard(self, shard: int) -> int: ...
    def shards_lost(self, shards: set[int]) -> None: ...
    def shards_gained(self, shards: set[int]) -> None: ...


def fair_share(shard_count: int, live: list[str], me: str) -> int:
    """This worker's share: floor, plus one for the first ``count % live`` workers."""
    n = max(1, len(live))
    base, extra = divmod(shard_count, n)
    position = live.index(me) if me in live else n - 1
    return base + (1 if position < extra else 0)


class Leaser(Service):
    name = "leaser"

    def __init__(
        self,
        config: PipelineConfig,
        hub: ShardHub,
        store: WorkerStore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        settings = config.settings
        self.store = store
        self.worker_id = config.worker_id
        # The pool this worker leases shards in: it shares them with the live
        # workers of the same pool only (shardq.core.pools).
        self.pool = config.pool
        self.stats = hub.stats
        self.shard_count = settings.shard_count
        self.ttl = settings.lease_ttl_seconds
        self.heartbeat = settings.heartbeat_seconds
        self.margin = max(0.05, self.ttl * 0.1)
        # What holds jobs of a shard, and who is told of shards gained and lost.
        self.running_in_shard = hub.running_in_shard
        self.on_lost = hub.shards_lost
        self.on_gained = hub.shards_gained
        self.clock = clock
        # Started as one of N sibling processes (--processes N): until the
        # first claim, count siblings that have not registered yet, so the
        # group does not first pile every shard on one process and then
        # rebalance them one by one.
        self.expected_workers = config.expected_workers
        self._first_claim_done = False
        self.max_worker_losses = settings.max_worker_losses
        # A peer's release or join wakes the lease round at most this often
        # (a joiner is woken by the release that gives it its share: a wake
        # held back 250 ms, as it was, left those shards unowned as long).
        self.lease_wakes = WakeLimiter(LEASE_WAKE_SECONDS)

        self.held: dict[int, int] = {}  # shard -> claim_version
        self.ownership = RWLock()  # read: a claim in flight; write: dropping shards
        self.draining: set[int] = set()  # held, not fetched from, released once idle
        self.trusted_until = 0.0
        self.share = 0
        self.live_workers = 0
        self.shutting_down = False
        # Shutdown, once nothing is buffered here any more: each held shard is
        # released as soon as none of its jobs runs here (release_when_idle).
        self.releasing_to_stop = False
        self.released_while_stopping = 0
        self.database_ok = True
        # Dead-owner detection (the module docstring): off by the setting, or
        # for an alias that looks like a transaction pool (``off_because``).
        self.off_because = (
            "SHARDQ['DEAD_OWNER_DETECTION'] is False"
            if not settings.dead_owner_detection
            else transaction_pooled(config.database)
        )
        self.detect_dead_owners = self.off_because is None
        self.check_interval = settings.dead_owner_check_seconds
        # A peer's session must be seen gone this long (two checks) to be dead.
        self.dead_owner_grace = 2 * self.check_interval
        # (worker, recorded pid) -> when first seen gone; and the peers found
        # dead, passed to the heartbeat and the claim (this thread only).
        self._suspects: dict[tuple[str, int], float] = {}
        self.dead_owners: frozenset[str] = frozenset()
        self._wake = threading.Event()
        self._claim_first = False  # set by wake_to_claim, read by the next tick
        self._watch: threading.Thread | None = None

    # -- queries from other threads ------------------------------------------

    def begin_stop(self) -> None:
        """Shutdown has begun: trust no lease for new starts, claim no shard."""
        self.shutting_down = True

    def release_when_idle(self) -> None:
        """Shutdown, after the buffered jobs were handed back and no claim
        is in flight: drain every held shard, so that each is released as
        soon as none of its jobs runs here (or has an unwritten write),
        while the others' jobs finish within the grace. A durable job
        handed back at a boundary is then taken by the next owner at once,
        not when the slowest job of this worker ends (docs/durable.md,
        "Rolling deploys")."""
        with self._dropping():
            self.draining.update(self.held)
        self.releasing_to_stop = True
        self._wake.set()

    def recall_buffered(self, shard: int) -> None:
        """Hand back the buffered jobs of ``shard`` (READY again), keeping
        the shard: under the write side of ``ownership``, so a claim in
        flight has buffered its jobs first and none is missed (an ordered
        job suspended: its key's jobs must not run before it resumes)."""
        with self._dropping():
            self.on_lost({shard})

    def trusts(self, shard: int, fence: int) -> bool:
        """May a job of ``shard`` claimed under ``fence`` start now?"""
        return self.held.get(shard) == fence and self.clock() < self.trusted_until

    def fetchable(self) -> dict[int, int]:
        """Shards to claim jobs from: held, trusted, not draining."""
        if self.shutting_down or self.clock() >= self.trusted_until:
            return {}
        held = dict(self.held)
        for shard in self.draining:
            held.pop(shard, None)
        return held

    def wake(self) -> None:
        self._wake.set()

    def wants_shards(self) -> bool:
        """Below its share, not draining, not stopping: a peer's release is
        for this worker to take now (the listener wakes it without delay)."""
        return not self.shutting_down and self.database_ok and not self.draining and len(self.held) < self.share

    def wake_to_claim(self) -> None:
        """A peer released shards (join-to-fair-share, issue 13): run the
        next round claim-first. The claim is the one statement that ends a
        released shard's time without an owner; the renewal and heartbeat
        before it cost a joiner that already runs jobs some 50 ms (two
        round trips) while those shards sat unowned."""
        self._claim_first = True
        self._wake.set()

    # -- notifications (the worker subscribes this, listener.py) ----------------

    def subscription(self) -> Subscription:
        return Subscription(self.lease_notified, lambda: self.lease_wakes.pending, self._flush_wakes)

    def lease_notified(self, payload: str) -> None:
        """A peer released shards or joined (payload: its worker id)."""
        # Our own announcements come back too: they need no lease round
        # (and must not use up the rate limit a peer's release needs).
        if payload == self.worker_id:
            return
        if self.wants_shards():
            # Below its share, a peer's release is ours to take: claim at
            # once, not after the limiter's interval (a joiner woke up to
            # 50 ms late for a second batch of released shards, which sat
            # unowned meanwhile). A flood of spoofed notices costs at most
            # back-to-back claim attempts, and only until the share is held.
            self.wake_to_claim()
        elif self.lease_wakes.ask():
            self.wake()

    def _flush_wakes(self) -> None:
        if self.lease_wakes.due():
            self.wake()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        if self.off_because is not None and self.off_because != "SHARDQ['DEAD_OWNER_DETECTION'] is False":
            logger.info(
                "dead-owner detection is off: %s (a dead worker's shards are taken over when its leases "
                "expire, after LEASE_TTL %gs)",
                self.off_because,
                self.ttl,
            )
        self.tick()  # hold a share before the first fetch
        super().start()
        self._watch = threading.Thread(target=self._watch_trust, name=f"shardq-{self.name}-deadline", daemon=True)
        self._watch.start()

    def run(self) -> None:
        while not self.stopping:
            interval = self.heartbeat
            if not self.database_ok:
                interval = min(interval, 0.5)
            elif self.draining or len(self.held) > self.share:
                # Rebalancing: release the next shard after a short pause,
                # not a whole heartbeat later.
                interval = min(interval, 0.02)
            self._wait(interval)
            self._wake.clear()
            if self.stopping:
                break
            self.tick()

    def _wait(self, interval: float) -> None:
        """Wait ``interval`` seconds or for a wake; with dead-owner detection
        on, check for dead peers every ``check_interval`` meanwhile and end
        the wait when one is found (the next round takes its shards)."""
        if not self.detect_dead_owners:
            self._wake.wait(interval)
            return
        until = time.monotonic() + interval
        while (left := until - time.monotonic()) > 0:
            if self._wake.wait(min(left, self.check_interval)) or self.stopping:
                return
            if not self.shutting_down and self.detect_dead_owners and self.check_dead_owners():
                return

    def check_dead_owners(self) -> bool:
        """One dead-owner check: should a round run now? Yes when a peer was
        just found dead (seen gone for ``dead_owner_grace``), when a dead
        peer still holds leases and this worker is below its share, and when
        the check itself could not reach the database: this thread's
        connection may have dropped, and the round reconnects and records
        the new session before the peers take this worker for dead."""
        try:
            rows = self.store.dead_owners(self.worker_id, self.ttl, self.pool)
        except DatabaseUnavailable:
            return True
        except StatementRejected as exc:
            # Not a matter of the rows (any value they hold is read safely):
            # the server refuses the check itself. Detection stops; the TTL
            # still takes a dead worker's shards.
            self.detect_dead_owners = False
            self.dead_owners = frozenset()
            logger.warning("dead-owner detection is off: its check was refused: %s", exc)
            return False
        self.stats.add("dead_owner_checks")
        now = time.monotonic()
        holding = {worker for worker, _, holds, _ in rows if holds}
        # Its LISTEN session gone too: the process, not a connection, is
        # gone (a dropped connection leaves the other): no grace.
        self._suspects = {
            (w, pid): min(self._suspects.get((w, pid), now), now - self.dead_owner_grace if whole else now)
            for w, pid, _, whole in rows
        }
        dead = frozenset(w for (w, _), since in self._suspects.items() if now - since >= self.dead_owner_grace)
        found = dead - self.dead_owners
        self.dead_owners = dead
        if found:
            self.stats.add("dead_owners", len(found))
            whole = {w for w, _, _, gone in rows if gone}
            logger.warning(
                "worker(s) %s: %s (the process died): taking over their shards now, not when their leases expire",
                ", ".join(sorted(found)),
                "lease and LISTEN sessions gone from the database"
                if found <= whole
                else f"lease session gone from the database for {self.dead_owner_grace:.2f}s or more",
            )
            return True
        return bool(dead & holding) and self.wants_shards()

    def _watch_trust(self) -> None:
        """Self-fence at the trust deadline even while the leaser thread is
        stuck in a statement (a silent partition: no error comes back until
        the connection's TCP timeout). Past the deadline ``trusts()`` already
        refuses every start; this drops the buffered jobs and says so. A
        renewal that lands after the watch fired leaves the shards it renewed
        to expire (they are no longer in ``held``, so nothing renews them) and
        be claimed again: a late renewal costs a TTL of those shards, never a
        second owner."""
        try:
            while not self.stopping:
                left = self.trusted_until - self.clock()
                if left > 0 or not self.held:
                    self._stop.wait(min(max(left, 0.01), self.heartbeat))
                    continue
                shards = set(self.held)
                if shards:
                    # Past the deadline: a claim stuck on the same dead link
                    # holds the read side; waiting a heartbeat for it let the
                    # drop come after the leases had expired. Nothing it
                    # brings back can start (trusts() refuses) and it hands
                    # back jobs of shards no longer held.
                    self._self_fence(
                        shards,
                        "no renewal reached the database before the trust deadline",
                        wait_seconds=self.margin / 4,
                    )
        except BaseException as exc:  # a dead watch must stop the worker loudly (Service)
            self.failure = exc
            logger.exception("the lease deadline watch died; the worker stops")

    def interrupt(self) -> None:
        self._wake.set()

    def after_stop(self, deadline: float) -> None:
        if self._watch is not None:
            self._watch.join(timeout=max(0.1, deadline - time.monotonic()))

    # -- one round of the protocol ----------------------------------------------

    def tick(self) -> None:
        if self._claim_first:
            self._claim_first = False
            self._claim_released()
        try:
            self._renew()
            self.stats.add("heartbeats")
            live, cluster_count = self.store.beat(
                self.worker_id,
                self.stats.snapshot(),
                self.ttl,
                self.pool,
                dead=self.dead_owners,
                identity=self.detect_dead_owners,
            )
            self.database_ok = True
        except DatabaseUnavailable as exc:
            self.stats.add("db_errors")
            if self.database_ok:
                logger.warning("database unavailable: %s", exc)
            self.database_ok = False
            if self.held and self.clock() >= self.trusted_until:
                self._self_fence(set(self.held), "cannot reach the database before the trust deadline")
            return
        self.live_workers = len(live)
        self._learn_shard_count(cluster_count)
        self.share = fair_share(self.shard_count, live, self.worker_id)
        if not self._first_claim_done and self.expected_workers > len(live):
            self.share = min(self.share, -(-self.shard_count // self.expected_workers))
        if self.shutting_down:
            if self.releasing_to_stop and self.draining:
                try:
                    self._finish_draining()
                except DatabaseUnavailable as exc:
                    self.stats.add("db_errors")
                    self.database_ok = False
                    logger.warning("database unavailable: %s", exc)
            return
        try:
            excess = len(self.held) - len(self.draining) - self.share
            if excess > 0:
                # Give back the highest-numbered shards above the share, all
                # at once: stop claiming from them and hand back their
                # buffered jobs now; each is released as soon as none of its
                # jobs runs here (this tick for short tasks, later ones for
                # long). One at a time, a joining worker waited a tick per
                # shard for its share.
                kept = sorted(s for s in self.held if s not in self.draining)
                self.start_draining(*kept[-excess:])
            if self.draining:
                self._finish_draining()
            elif len(self.held) < self.share:
                self._claim(self.share - len(self.held))
                self._first_claim_done = True
        except DatabaseUnavailable as exc:
            self.stats.add("db_errors")
            self.database_ok = False
            logger.warning("database unavailable: %s", exc)

    def _learn_shard_count(self, cluster_count: int | None) -> None:
        """Resharding (manage.py shardq_reshard): the cluster's shard count
        comes with every heartbeat. A raised count only adds shards: the
        held ones stay held (their jobs that now belong to a new shard were
        moved by the reshard, or finish here), the share grows, and this
        tick claims new shards like any unowned ones. The count never falls
        (the command refuses to shrink)."""
        if cluster_count is None or cluster_count <= self.shard_count:
            return
        logger.info(
            "the cluster's shard count went from %s to %s (shardq_reshard); claiming a share of the new shards",
            self.shard_count,
            cluster_count,
        )
        self.stats.add("shard_count_changes")
        self.shard_count = cluster_count

    def _claim_released(self) -> None:
        """Claim up to the share known from the last heartbeat before this
        round's renewal. Safe whatever happened since: the claim takes only
        unowned or expired shards (SKIP LOCKED, a new claim_version), so it
        can never make a second owner; a share that shrank meanwhile is given
        back by this same round's drain."""
        if not self.wants_shards():
            return
        try:
            self._claim(self.share - len(self.held))
            self._first_claim_done = True
        except DatabaseUnavailable as exc:
            self.stats.add("db_errors")
            self.database_ok = False
            logger.warning("database unavailable: %s", exc)

    def _renew(self) -> None:
        if not self.held:
            return
        sent = self.clock()
        held = dict(self.held)
        kept = self.store.renew_leases(self.worker_id, held, self.ttl, self.pool)
        lost = set(held) - kept
        if lost:
            self._self_fence(lost, "the renewal returned fewer shards than it sent")
        self.trusted_until = sent + self.ttl - self.margin
        if kept:
            # A claim by the previous owner that raced our takeover left jobs
            # CLAIMED under its old version: nobody runs them; put them back.
            swept = self.store.rescue_jobs({s: held[s] for s in kept}, self.max_worker_losses, self.ttl)
            if swept:
                self.stats.add("rescued", len(swept))
                logger.info("put back %s jobs claimed under a superseded lease", len(swept))

    def _claim(self, wanted: int) -> None:
        sent = self.clock()
        dead = self.dead_owners
        rows = self.store.claim_shards(
            self.worker_id, wanted, self.ttl, self.shard_count, self.max_worker_losses, self.pool, dead=dead
        )
        if not rows:
            return
        # New shards are trusted from this claim; shards already held keep the
        # (earlier, so stricter) deadline of this tick's renewal. Set before
        # they enter ``held``: the deadline watch must never see a new shard
        # under an old, passed deadline.
        if self.trusted_until <= sent:
            self.trusted_until = sent + self.ttl - self.margin
        gained = set()
        taken_over: set[int] = set()
        from_dead = False
        rescued_jobs = 0
        for row in rows:
            shard, version, previous_owner, rescued = (
                row["shard"],
                row["claim_version"],
                row["previous_owner"],
                row["rescued"],
            )
            self.held[shard] = version
            gained.add(shard)
            self.stats.add("shard_claims")
            if previous_owner is not None:
                self.stats.add("takeovers")
                taken_over.add(shard)
                if str(previous_owner) in dead:
                    self.stats.add("dead_owner_takeovers")
                    from_dead = True
            if rescued:
                self.stats.add("rescued", rescued)
                rescued_jobs += rescued
        logger.info(
            "claimed %s shard(s) %s%s; holding %s (share %s, %s live worker(s) in pool %s)",
            len(gained),
            shard_ranges(gained),
            f" (took over the {'dead worker(s)' if from_dead else 'expired'} lease(s) of {shard_ranges(taken_over)}: "
            f"{rescued_jobs} job(s) rescued)"
            if taken_over
            else "",
            len(self.held),
            self.share,
            self.live_workers,
            self.pool,
        )
        self.on_gained(gained)

    def start_draining(self, *shards: int) -> None:
        """Stop claiming from ``shards`` and hand back their buffered jobs."""
        with self._dropping():
            self.draining.update(shards)
            self.on_lost(set(shards))

    @contextmanager
    def _dropping(self, wait_seconds: float | None = None) -> Iterator[None]:
        """The write side of ``ownership``, waited for at most ``wait_seconds`` (a heartbeat)."""
        wait = self.heartbeat if wait_seconds is None else wait_seconds
        locked = self.ownership.acquire_write(timeout=wait)
        if not locked:
            logger.warning(
                "a claim has not come back in %.2fs; dropping shards without waiting for it "
                "(it hands back what it brings for them)",
                wait,
            )
        try:
            yield
        finally:
            if locked:
                self.ownership.release_write()

    def _finish_draining(self) -> None:
        """Release, in one statement, the draining shards none of whose jobs
        runs here any more (or has an unwritten outcome); the rest wait for
        the next tick."""
        idle = {s: v for s in self.draining if (v := self.held.get(s)) is not None and not self.running_in_shard(s)}
        gone = {s for s in self.draining if s not in self.held}
        if not idle and not gone:
            return
        # A shard stays in ``draining`` until it has left ``held``: clearing
        # it first (as this once did) put it back in ``fetchable()`` for the
        # release's round trip, so a claim could take jobs of a shard being
        # released; they then sat CLAIMED with no owner and the next owner's
        # takeover rescued them (the rolling-restart test's stray
        # ``rescued == 1``). A release that fails (database away) leaves the
        # shards draining, retried at the next tick.
        # The release NOTIFYs the lease channel in its own statement: peers
        # below their share hear it at this commit (one round trip sooner
        # than a separate NOTIFY, and never a release without its notice).
        released = self.store.release_shards(self.worker_id, idle, self.pool, LEASE_CHANNEL) if idle else set()
        with self._dropping():
            # Under the write side: ``fetchable()`` (called under the read
            # side) reads ``held`` and ``draining`` one after the other and
            # must never see a shard held but no longer draining.
            for shard in idle.keys() | gone:
                self.held.pop(shard, None)
                self.draining.discard(shard)
        if released:
            self.stats.add("releases", len(released))
            if self.shutting_down:
                self.released_while_stopping += len(released)
            logger.info(
                "released %s shard(s) %s to the pool's other workers; holding %s (share %s)",
                len(released),
                shard_ranges(released),
                len(self.held),
                self.share,
            )

    def _self_fence(self, shards: set[int], why: str, wait_seconds: float | None = None) -> None:
        with self._dropping(wait_seconds):
            # The watch and the leaser thread may both get here for the same
            # shards: only the ones still held are dropped and counted.
            shards = {s for s in shards if s in self.held}
            if not shards:
                return
            for shard in shards:
                self.held.pop(shard, None)
            self.draining -= shards
            self.stats.add("self_fences", len(shards))
            logger.warning("self-fenced %s shard(s) %s: %s", len(shards), shard_ranges(shards), why)
            self.on_lost(shards)

    def announce(self) -> None:
        """Tell every worker to run a lease round now (a join or a release)."""
        self._notify_release()

    def _notify_release(self) -> None:
        try:
            self.store.notify(LEASE_CHANNEL, self.worker_id)
        except DatabaseUnavailable:
            pass  # others claim at their next heartbeat anyway

    def release_all(self, keep: set[int] | frozenset[int] = frozenset()) -> int:
        """Release every held shard except ``keep`` (shutdown). Returns how many."""
        pairs = {s: v for s, v in self.held.items() if s not in keep}
        if not pairs:
            return 0
        released = self.store.release_shards(self.worker_id, pairs, self.pool, LEASE_CHANNEL)  # NOTIFYs too
        for shard in released:
            self.held.pop(shard, None)
        self.stats.add("releases", len(released))
        return len(released)
