"""The waker of one worker process: suspended durable jobs whose time has come go back to READY.

A durable job that sleeps, or waits for a signal with a timeout, is
SUSPENDED in the table with ``run_after`` = when it wakes, off the claim
index (shardq/durable.py). A signal wakes its waiting job itself, in the
sender's transaction, and NOTIFYs the job's shard. Time wakes the others:
this thread runs ``wake_due_jobs`` over the shards its worker holds, then
sleeps until the next one falls due (``seconds_until_wake``), at most
``interval_seconds`` (the poll fallback: suspensions written by another
worker, shards gained), woken early when an executor here suspends a job.
Woken jobs are READY: the fetcher is told at once (``wake_fetch``), and
the shard's other pools hear of them through the next claim's poll.

State model: each pass is one statement (SKIP LOCKED), so a crash anywhere
leaves the jobs SUSPENDED for the next pass, here or at the shard's next
owner.
"""

import logging
import threading
from collections.abc import Callable

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.waker")

BATCH = 500


class Waker(Service):
    name = "waker"

    def __init__(
        self,
        store: WorkerStore,
        shards: Callable[[], list[int]],
        stats: Stats,
        wake_fetch: Callable[[], None],
        *,
        interval_seconds: float = 1.0,
        batch: int = BATCH,
    ) -> None:
        super().__init__()
        self.store = store
        self.shards = shards
        self.stats = stats
        self.wake_fetch = wake_fetch
        self.interval = interval_seconds
        self.batch = batch
        self._wake = threading.Event()
        self._unavailable = False

    def wake(self) -> None:
        """Look again now (a job was suspended here: its time may be the next)."""
        self._wake.set()

    def interrupt(self) -> None:
        self._wake.set()

    def run(self) -> None:
        wait = 0.0
        while not self.stopping:
            self._wake.wait(wait)
            self._wake.clear()
            if self.stopping:
                break
            try:
                wait = self.pass_once()
                self._unavailable = False
            except DatabaseUnavailable as exc:
                if not self._unavailable:
                    logger.warning("waker: database unavailable (%s); retrying", exc)
                self._unavailable = True
                wait = 0.5
            except StatementRejected as exc:
                self.stats.add("waker_errors")
                logger.error("waker: a pass was refused (%s); retrying at the next", exc)
                wait = self.interval

    def finished(self) -> None:
        self.store.close()

    def pass_once(self) -> float:
        """Wake every due job of the held shards; the seconds to sleep then."""
        shards = self.shards()
        if not shards:
            return self.interval
        while True:
            rows = self.store.run("wake_due_jobs", {"shards": shards, "batch": self.batch, "now": None})
            if rows:
                self.stats.add("woken", len(rows))
                self.wake_fetch()
            if len(rows) < self.batch:
                break
        row = self.store.run("seconds_until_wake", {"shards": shards, "now": None}, fetch="one")
        seconds = row[0] if row else None
        if seconds is None:
            return self.interval
        return max(0.0, min(self.interval, seconds))
