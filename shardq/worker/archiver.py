"""The archiver: finished jobs leave the hot table (docs/architecture.md, "History").

``shardq_job`` holds the live work: the claim walks its partial indexes, and
every finished row it keeps is one more for vacuum, the admin and prune to
wade through. This service moves finished jobs to ``shardq_job_history``
(partitioned by ``finished_at``) ``HISTORY_GRACE`` seconds after they
finished — so a fresh result is still read from the hot table — in batches of
``HISTORY_BATCH``, each one statement (``archive_jobs``: DELETE ... RETURNING
into INSERT), and keeps the history's partitions: created ahead, dropped
whole once past ``HISTORY_DAYS`` (no bulk DELETE, no dead rows to vacuum).

One archiver works at a time, cluster-wide: the one whose connection holds a
session advisory lock (``ARCHIVER_LOCK``), asked for at every pass, as the
cluster gauges' holder is chosen (gauges.py). A worker that dies or loses its
connection loses the lock with the session; the next worker's pass takes it.
Two archivers could not corrupt anything anyway (each row is moved once:
``FOR UPDATE SKIP LOCKED``, and a DELETE of a row another statement moved
deletes nothing); the lock keeps them from contending.

State model: every move is one statement, so a crash anywhere leaves each job
in exactly one of the two tables. A pass that fails (database unavailable, a
statement refused) is retried at the next one.
"""

import logging
import threading
import time
from collections.abc import Callable

from ..conf import HistoryConfig
from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.archiver")

# A pass moves at most this many batches, then sleeps (stop stays prompt, and
# a backlog after an outage drains at a bounded rate beside the workers).
MAX_BATCHES_PER_PASS = 20


class Archiver(Service):
    name = "archiver"

    def __init__(
        self,
        store: WorkerStore,
        history: HistoryConfig,
        stats: Stats,
        *,
        interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.store = store
        self.history = history
        self.stats = stats
        self.interval = interval_seconds
        self.clock = clock
        # Partitions are looked at (created ahead, dropped past the retention)
        # a few times a partition, at most once a minute.
        self.maintain_seconds = min(60.0, history.partition_seconds / 4)
        self.next_maintenance = 0.0
        self.floor = None  # the oldest partition's start: older jobs are past the retention
        self.ceiling = None  # the newest partition's end
        self.holder = False
        self._wake = threading.Event()
        self._unavailable = False

    def interrupt(self) -> None:
        self._wake.set()

    def after_stop(self, deadline: float) -> None:
        self.store.close()  # releases the lock with the session: the next worker takes over

    def run(self) -> None:
        while not self.stopping:
            wait = self.interval
            try:
                if self.pass_once() >= self.history.batch * MAX_BATCHES_PER_PASS:
                    wait = 0.0  # a backlog: go on at once
                self._unavailable = False
            except DatabaseUnavailable as exc:
                if not self._unavailable:
                    logger.warning("archiver: database unavailable (%s); retrying", exc)
                self._unavailable = True
                self.holder = False
            except StatementRejected as exc:
                self.stats.add("archiver_errors")
                logger.error("archiver: a pass was refused (%s); retrying at the next", exc)
                self.next_maintenance = 0.0  # a missing partition, a column drift: look again
            self._wake.wait(wait)
            self._wake.clear()

    def pass_once(self) -> int:
        """One pass, if this worker holds the archiver's lock: the partitions
        kept when due, then up to MAX_BATCHES_PER_PASS batches moved. Returns
        the jobs that left shardq_job (0 when another worker archives)."""
        holder = self.store.archiver_lock()
        if holder != self.holder:
            self.holder = holder
            if holder:
                logger.info("archiver: this worker moves finished jobs to shardq_job_history")
                self.next_maintenance = 0.0
        if not holder:
            return 0
        if self.clock() >= self.next_maintenance or self.ceiling is None:
            self.maintain()
        if self.ceiling is None:
            return 0
        left = 0
        for _ in range(MAX_BATCHES_PER_PASS):
            gone, kept = self.store.archive_jobs(
                self.history.grace_seconds, self.history.batch, self.floor, self.ceiling
            )
            left += gone
            if kept:
                self.stats.add("archived", kept)
            if gone > kept:
                self.stats.add("expired_unarchived", gone - kept)
            if gone < self.history.batch or self.stopping:
                break
        return left

    def maintain(self) -> None:
        """Create the partitions ahead, drop those past the retention, and
        learn the span the partitions cover."""
        width = self.history.partition_seconds
        created, dropped = self.store.maintain_history(self.history.keep_seconds, width, ahead_seconds=2 * width)
        if created:
            self.stats.add("history_partitions_created", len(created))
        if dropped:
            self.stats.add("history_partitions_dropped", len(dropped))
            logger.info("archiver: dropped history partitions past the retention: %s", ", ".join(dropped))
        partitions = [p for p in self.store.history_partitions() if p["low"] is not None and p["high"] is not None]
        self.floor = min((p["low"] for p in partitions), default=None)
        self.ceiling = max((p["high"] for p in partitions), default=None)
        self.next_maintenance = self.clock() + self.maintain_seconds
