"""The metrics' gauges of one worker process (only with metrics on).

Every second it adds the per-job events the executors queued to their
metrics (``Metrics.flush``: the executors only append to a deque) and sets
this worker's gauges (shards leased, busy and total slots) from the worker's
own state, with no statement.

The cluster gauges (unfinished jobs by queue and state, the oldest due READY
job's age by queue, unowned shards) are computed by exactly one worker at a
time, whatever the pools: the one whose metrics connection holds a session
advisory lock (``metrics_lock``). PostgreSQL grants it to one session; a
worker that dies or loses its connection loses it with the session, and the
next worker to ask — every metrics-enabled worker asks once a heartbeat —
takes over. The holder runs three statements a heartbeat (the third: each
queue's top fair keys, docs/fairness.md; a fourth, the live queue
controls); the others export
zeros (a worker that held the lock zeroes what it had set), so ``sum`` and
``max`` over all workers both give the holder's value.
"""

import logging
import time
from collections.abc import Callable

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from ..fairness import summarize_fair_keys
from .metrics import Metrics
from .service import Service

logger = logging.getLogger("shardq.worker.gauges")

WORKER_GAUGE_SECONDS = 1.0


class Gauges(Service):
    name = "gauges"

    def __init__(
        self,
        store: WorkerStore,
        metrics: Metrics,
        *,
        sample: Callable[[], tuple[int, int, int]],
        cluster_seconds: float,
        lease_ttl_seconds: float,
        shard_count: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sample()`` -> (shards leased, busy slots, slots)."""
        super().__init__()
        self.store = store
        self.metrics = metrics
        self.sample = sample
        self.cluster_seconds = cluster_seconds
        self.lease_ttl_seconds = lease_ttl_seconds
        self.shard_count = shard_count
        self.clock = clock
        self.holder = False

    def after_stop(self, deadline: float) -> None:
        self.metrics.flush()  # the last jobs' events
        self.store.close()  # releases the lock with the session: the next worker takes over

    def run(self) -> None:
        next_cluster = self.clock()
        while not self.stopping:
            self.sample_worker()
            if self.clock() >= next_cluster:
                self.sample_cluster()
                next_cluster = self.clock() + self.cluster_seconds
            self._stop.wait(WORKER_GAUGE_SECONDS)

    def sample_worker(self) -> None:
        self.metrics.flush()
        shards, busy, slots = self.sample()
        self.metrics.worker_sample(shards_owned=shards, busy=busy, slots=slots)

    def sample_cluster(self) -> None:
        """Compute the cluster gauges if this worker holds the lock, else zero them."""
        try:
            self.holder = self.store.metrics_lock()
            if self.holder:
                rows, unowned = self.store.cluster_metrics(self.lease_ttl_seconds, self.shard_count)
                self.metrics.cluster_sample(rows, unowned)
                self.metrics.fair_sample(summarize_fair_keys(self.store.fair_keys()))
                self.metrics.queue_control_sample(self.store.queue_controls())
                self.metrics.history_sample(self.store.history_gauges())
                return
        except (DatabaseUnavailable, StatementRejected) as exc:
            # The session (and with it the lock) may be gone: export nothing
            # stale; ask again at the next round.
            logger.warning("cluster metrics not computed: %s", exc)
            self.holder = False
        self.metrics.cluster_sample(None)
        self.metrics.fair_sample(None)
        self.metrics.queue_control_sample(None)
        self.metrics.history_sample(None)
