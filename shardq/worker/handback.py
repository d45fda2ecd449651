"""Hand-backs: claimed jobs this worker will not run go back to READY.

A claim can bring jobs that never start here: the shard was lost or is
draining (``Worker.on_shards_lost``), the starter or an executor refused
one, the fetcher found a claim it had lost, or shutdown left jobs in the
buffer. Each goes back with one fenced ``return_jobs`` statement per batch,
written by this service's own thread on its own connection, so a hand-back
never waits behind outcomes (the completer's) or they behind it.

Hand-backs are counted as pending in their shard until written: the leaser
releases a shard only once nothing of it is pending here, or the next owner
would find the jobs still claimed under this lease and rescue them, counting
an attempt that never ran.

Deploy safety: a claimed job whose task path this worker cannot resolve
(new code enqueued a task this old worker lacks) is not failed. It goes back
READY, due again a little later (``unknown_task_retry_seconds``), with no
attempt used, for a worker that can run it: its shard's next owner after the
deploy. Only once no worker could resolve it for
``SHARDQ["UNKNOWN_TASK_TIMEOUT"]`` seconds is it dead-lettered, its error
naming the path (``defer_unknown_jobs``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..conf import unknown_task_retry_seconds
from ..db.store import JobRef, WorkerStore
from ..exceptions import DatabaseUnavailable
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.handback")


class ReturnedJob(JobRef, Protocol):
    """A claimed job handed back (a ``ClaimedJob``, or the fetcher's ``LostClaim``)."""

    @property
    def shard(self) -> int: ...


def retrying[R](
    call: Callable[[], R], what: str, deadline: float | None, stats: Stats, log: logging.Logger
) -> tuple[R, bool]:
    """Run ``call`` until it succeeds, backing off while the database is
    unavailable (the same fenced statement again: it applies at most once);
    returns (result, whether a try failed). Past ``deadline`` (monotonic) the
    DatabaseUnavailable is raised."""
    delay, failed = 0.05, False
    while True:
        try:
            return call(), failed
        except DatabaseUnavailable as exc:
            failed = True
            stats.add("db_errors")
            log.warning("%s failed, sending the same fenced write again: %s", what, exc)
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class HandBack(Service):
    name = "handback"

    def __init__(self, store: WorkerStore, stats: Stats) -> None:
        super().__init__()
        self.store = store
        self.stats = stats
        self._lock = threading.Lock()
        self._waiting = threading.Condition(self._lock)
        self._jobs: list[ReturnedJob] = []
        self._unknown: list[tuple[ReturnedJob, float]] = []
        self._pending_by_shard: dict[int, int] = {}

    # -- from the other services -------------------------------------------------

    def return_jobs(self, jobs: Sequence[ReturnedJob]) -> None:
        """Claimed jobs that will not start here: back to READY (fenced)."""
        if not jobs:
            return
        with self._lock:
            for job in jobs:
                self._pending_by_shard[job.shard] = self._pending_by_shard.get(job.shard, 0) + 1
            self._jobs.extend(jobs)
            self._waiting.notify()

    def defer_unknown(self, jobs: Sequence[ReturnedJob], timeout_seconds: float) -> None:
        """Claimed jobs whose task path this worker cannot resolve: back to
        READY for a worker that can run them, no attempt used (fenced), or
        dead-lettered once none could for ``timeout_seconds``
        (SHARDQ["UNKNOWN_TASK_TIMEOUT"])."""
        if not jobs:
            return
        with self._lock:
            for job in jobs:
                self._pending_by_shard[job.shard] = self._pending_by_shard.get(job.shard, 0) + 1
            self._unknown.extend((job, timeout_seconds) for job in jobs)
            self._waiting.notify()

    def pending_in_shard(self, shard: int) -> int:
        with self._lock:
            return self._pending_by_shard.get(shard, 0)

    @property
    def pending(self) -> int:
        with self._lock:
            return sum(self._pending_by_shard.values())

    # -- the thread ----------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping:
            self.flush_once(block=True)

    def interrupt(self) -> None:
        with self._lock:
            self._waiting.notify()

    def after_stop(self, deadline: float) -> None:
        """Write every hand-back still queued, until ``deadline`` (monotonic)."""
        while self.pending and time.monotonic() < deadline:
            self.flush_once(block=False, deadline=deadline)

    def flush_once(self, block: bool, deadline: float | None = None) -> None:
        with self._lock:
            if block and not self._jobs and not self._unknown and not self.stopping:
                self._waiting.wait(0.5)
            jobs, self._jobs = self._jobs, []
            unknown, self._unknown = self._unknown, []
        if jobs:
            self._write(jobs, deadline)
        for timeout in sorted({timeout for _, timeout in unknown}):
            self._write([job for job, t in unknown if t == timeout], deadline, defer=timeout)

    def _write(self, jobs: list[ReturnedJob], deadline: float | None, defer: float | None = None) -> None:
        """Return ``jobs`` (fenced); with ``defer`` (a timeout), defer them
        as jobs whose task this worker cannot resolve."""
        try:
            if defer is not None:
                returned = self._defer(jobs, deadline, defer)
            else:
                returned, _ = retrying(lambda: self.store.return_jobs(jobs), "return", deadline, self.stats, logger)
        except DatabaseUnavailable:
            return  # still claimed under the old fence: the next takeover rescues them
        finally:
            with self._lock:
                for job in jobs:
                    left = self._pending_by_shard[job.shard] - 1
                    if left:
                        self._pending_by_shard[job.shard] = left
                    else:
                        del self._pending_by_shard[job.shard]
        self.stats.add("returned", len(returned))

    def _defer(self, jobs: list[ReturnedJob], deadline: float | None, timeout: float) -> set[int]:
        delay = unknown_task_retry_seconds(timeout)
        written, _ = retrying(
            lambda: self.store.defer_unknown_jobs(jobs, delay, timeout), "deferral", deadline, self.stats, logger
        )
        paths = {job.id: getattr(job, "task_path", "?") for job in jobs}
        dead = [job_id for job_id, failed in written if failed]
        for job_id in dead:
            logger.error(
                "job %s dead-lettered: no worker could resolve its task %r for %gs (SHARDQ['UNKNOWN_TASK_TIMEOUT'])",
                job_id,
                paths.get(job_id),
                timeout,
            )
        deferred = [job_id for job_id, failed in written if not failed]
        if deferred:
            self.stats.add("unknown_task_deferrals", len(deferred))
            logger.warning(
                "job(s) %s handed back: this worker cannot resolve their task (%s), a worker that can "
                "will run them (dead-lettered after %gs: SHARDQ['UNKNOWN_TASK_TIMEOUT'])",
                ", ".join(map(str, deferred[:20])),
                ", ".join(sorted({repr(paths[i])[:120] for i in deferred})[:5]),
                timeout,
            )
        if dead:
            self.stats.add("unknown_task_dead", len(dead))
        return {job_id for job_id, _ in written}
