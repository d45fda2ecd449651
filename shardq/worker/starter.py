"""The start write: claimed is not started (DESIGN §5, "the lifecycle tells the truth").

A claimed job waits in memory as CLAIMED. When an executor thread really
starts it, the start write makes it RUNNING, counts the attempt and records
``started_at``, ``last_attempted_at`` and this worker in ``worker_ids``; only
then does the task run. So a crash never charges an attempt to a job that
did not start: the next owner's rescue finds it CLAIMED and puts it back
READY for free.

Group commit: executor threads that start jobs at the same moment share one
statement. The first thread to arrive becomes the leader and writes every
start queued so far; threads arriving meanwhile wait for the next batch,
whose leader is the first of them to wake. One round trip per batch, never
one per job, and no thread waits for more than the write in flight plus its
own.

The write is fenced like an ack (the claim's fence and rank, the shard not
handed over since): a job whose claim was superseded (a takeover rescued it)
is not started here.
"""

import logging
import threading

from ..exceptions import DatabaseUnavailable, StatementRejected

logger = logging.getLogger("shardq.worker.starter")

STARTED, LOST, REJECTED, UNAVAILABLE = "started", "lost", "rejected", "unavailable"


class _Entry:
    __slots__ = ("job", "verdict", "error")

    def __init__(self, job):
        self.job = job
        self.verdict: str | None = None
        self.error: Exception | None = None


class Starter:
    def __init__(self, store, stats, *, worker_id: str):
        self.store = store
        self.stats = stats
        self.worker_id = worker_id
        self._cond = threading.Condition()
        self._queued: list[_Entry] = []
        self._writing = False

    def start(self, job) -> tuple[str, Exception | None]:
        """Record ``job``'s start; returns (verdict, error).

        STARTED: the row is RUNNING under this claim and ``job`` carries its
        new attempts, status_rank and times: run it. LOST: the claim is no
        longer current: do not run it, write nothing. REJECTED: PostgreSQL
        refused this row (the error says why): fail the job. UNAVAILABLE: the
        database did not answer: hand the job back, do not run it."""
        entry = _Entry(job)
        with self._cond:
            self._queued.append(entry)
            while entry.verdict is None:
                if self._writing:
                    self._cond.wait()
                    continue
                self._writing = True
                batch, self._queued = self._queued, []
                self._cond.release()
                try:
                    self._write(batch)
                finally:
                    self._cond.acquire()
                    self._writing = False
                    self._cond.notify_all()
        return entry.verdict, entry.error

    def _write(self, batch: list[_Entry]) -> None:
        jobs = [entry.job for entry in batch]
        try:
            started, rejected = self.store.start_jobs(self.worker_id, jobs)
        except DatabaseUnavailable as exc:
            # The COMMIT may have landed with its answer lost: then the job is
            # RUNNING with an attempt counted yet never runs, and the next
            # owner's rescue counts it as a worker loss (at-least-once holds).
            self.stats.add("db_errors")
            logger.warning("start write failed; handing %s jobs back: %s", len(batch), exc)
            for entry in batch:
                entry.verdict, entry.error = UNAVAILABLE, exc
            return
        except BaseException as exc:  # a bug here must not leave waiters parked
            for entry in batch:
                entry.verdict, entry.error = UNAVAILABLE, exc if isinstance(exc, Exception) else None
            raise
        refused: dict[int, StatementRejected] = {job.id: error for job, error in rejected}
        for entry in batch:
            job = entry.job
            row = started.get(job.id)
            if row is not None:
                job.attempts = row["attempts"]
                job.status_rank = row["status_rank"]
                job.started_at = row["started_at"]
                job.last_attempted_at = row["last_attempted_at"]
                job.started_by = self.worker_id
                entry.verdict = STARTED
            elif job.id in refused:
                entry.verdict, entry.error = REJECTED, refused[job.id]
            else:
                entry.verdict = LOST
        self.stats.add("start_writes")
