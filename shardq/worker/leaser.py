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
drops those shards at once (self-fencing).

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

from ..core import pools
from ..core.rwlock import RWLock
from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable
from .logs import shard_ranges
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.leaser")

LEASE_CHANNEL = "shardq_lease"


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
        store: WorkerStore,
        worker_id: str,
        stats: Stats,
        *,
        shard_count: int,
        lease_ttl_seconds: float,
        heartbeat_seconds: float,
        running_in_shard: Callable[[int], int],
        on_lost: Callable[[set[int]], None],
        on_gained: Callable[[set[int]], None],
        clock: Callable[[], float] = time.monotonic,
        expected_workers: int = 1,
        max_worker_losses: int = 3,
        pool: str = pools.ALL,
    ) -> None:
        super().__init__()
        self.store = store
        self.worker_id = worker_id
        # The pool this worker leases shards in: it shares them with the live
        # workers of the same pool only (shardq.core.pools).
        self.pool = pool
        self.stats = stats
        self.shard_count = shard_count
        self.ttl = lease_ttl_seconds
        self.heartbeat = heartbeat_seconds
        self.margin = max(0.05, lease_ttl_seconds * 0.1)
        self.running_in_shard = running_in_shard
        self.on_lost = on_lost
        self.on_gained = on_gained
        self.clock = clock
        # Started as one of N sibling processes (--processes N): until the
        # first claim, count siblings that have not registered yet, so the
        # group does not first pile every shard on one process and then
        # rebalance them one by one.
        self.expected_workers = expected_workers
        self._first_claim_done = False
        self.max_worker_losses = max_worker_losses

        self.held: dict[int, int] = {}  # shard -> claim_version
        self.ownership = RWLock()  # read: a claim in flight; write: dropping shards
        self.draining: set[int] = set()  # held, not fetched from, released once idle
        self.trusted_until = 0.0
        self.share = 0
        self.live_workers = 0
        self.shutting_down = False
        self.database_ok = True
        self._wake = threading.Event()

    # -- queries from other threads ------------------------------------------

    def begin_stop(self) -> None:
        """Shutdown has begun: trust no lease for new starts, claim no shard."""
        self.shutting_down = True

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

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self.tick()  # hold a share before the first fetch
        super().start()

    def run(self) -> None:
        while not self.stopping:
            interval = self.heartbeat
            if not self.database_ok:
                interval = min(interval, 0.5)
            elif self.draining or len(self.held) > self.share:
                # Rebalancing: release the next shard after a short pause,
                # not a whole heartbeat later.
                interval = min(interval, 0.02)
            self._wake.wait(interval)
            self._wake.clear()
            if self.stopping:
                break
            self.tick()

    def interrupt(self) -> None:
        self._wake.set()

    # -- one round of the protocol ----------------------------------------------

    def tick(self) -> None:
        try:
            self._renew()
            self.stats.add("heartbeats")
            live = self.store.heartbeat(self.worker_id, self.stats.snapshot(), self.ttl, self.pool)
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
        self.share = fair_share(self.shard_count, live, self.worker_id)
        if not self._first_claim_done and self.expected_workers > len(live):
            self.share = min(self.share, -(-self.shard_count // self.expected_workers))
        if self.shutting_down:
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
        rows = self.store.claim_shards(
            self.worker_id, wanted, self.ttl, self.shard_count, self.max_worker_losses, self.pool
        )
        if not rows:
            return
        gained = set()
        taken_over: set[int] = set()
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
            if rescued:
                self.stats.add("rescued", rescued)
                rescued_jobs += rescued
        logger.info(
            "claimed %s shard(s) %s%s; holding %s (share %s, %s live worker(s) in pool %s)",
            len(gained),
            shard_ranges(gained),
            f" (took over the expired lease(s) of {shard_ranges(taken_over)}: {rescued_jobs} job(s) rescued)"
            if taken_over
            else "",
            len(self.held),
            self.share,
            self.live_workers,
            self.pool,
        )
        # New shards are trusted from this claim; shards already held keep the
        # (earlier, so stricter) deadline of this tick's renewal.
        if self.trusted_until <= sent:
            self.trusted_until = sent + self.ttl - self.margin
        self.on_gained(gained)

    def start_draining(self, *shards: int) -> None:
        """Stop claiming from ``shards`` and hand back their buffered jobs."""
        with self._dropping():
            self.draining.update(shards)
            self.on_lost(set(shards))

    @contextmanager
    def _dropping(self) -> Iterator[None]:
        """The write side of ``ownership``, waited for at most a heartbeat."""
        locked = self.ownership.acquire_write(timeout=self.heartbeat)
        if not locked:
            logger.warning(
                "a claim has not come back in %.1fs; dropping shards without waiting for it "
                "(it hands back what it brings for them)",
                self.heartbeat,
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
        released = self.store.release_shards(self.worker_id, idle, self.pool) if idle else set()
        with self._dropping():
            # Under the write side: ``fetchable()`` (called under the read
            # side) reads ``held`` and ``draining`` one after the other and
            # must never see a shard held but no longer draining.
            for shard in idle.keys() | gone:
                self.held.pop(shard, None)
                self.draining.discard(shard)
        if released:
            self.stats.add("releases", len(released))
            logger.info(
                "released %s shard(s) %s to the pool's other workers; holding %s (share %s)",
                len(released),
                shard_ranges(released),
                len(self.held),
                self.share,
            )
            self._notify_release()

    def _self_fence(self, shards: set[int], why: str) -> None:
        with self._dropping():
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
        released = self.store.release_shards(self.worker_id, pairs, self.pool)
        for shard in released:
            self.held.pop(shard, None)
        self.stats.add("releases", len(released))
        if released:
            self._notify_release()
        return len(released)
