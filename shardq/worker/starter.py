"""Start writes: a job is started when a thread begins it, never before (DESIGN §5).

A claimed job waits in the buffer as CLAIMED. An executor thread that takes
it, once any limit slot is its own, asks for its start here and waits:
the row becomes RUNNING, the attempt is counted and ``started_at``,
``last_attempted_at`` and this worker in ``worker_ids`` are written, and
only then does the thread call the task. So ``attempts == len(worker_ids)``
== the number of real starts, a crash charges an attempt only to the jobs
whose threads had begun them (the next owner's rescue finds the others
CLAIMED and puts them back READY for free), and a job never reads RUNNING
while it waits for a thread or a limit slot.

Group commit: threads that begin together share one statement. The first
thread to ask while no write is in flight writes its own job at once;
threads that ask while a write is in flight wait, each on a lock of its
own, and when the write ends the first of them writes the whole group that
gathered (every job asked until it takes the group). No thread of its own:
a no-op drain on four threads writes groups of two to four jobs, each a
round trip the threads wait for together.

The write is fenced like an ack (the claim's fence and rank, the shard not
handed over since): a job whose claim was superseded (a takeover rescued it)
is not run here (verdict LOST).

State model of a job in this worker: buffered (CLAIMED) -> its thread's
start write (CLAIMED, the thread waits) -> processing (RUNNING, attempt
counted, the task runs) -> outcome queued (completer).
"""

import logging
import threading
import time
from _thread import LockType
from _thread import allocate_lock as _allocate_lock
from collections.abc import Collection

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .jobs import STARTED, ClaimedJob
from .stats import Stats
from .testsignal import TestSignal

logger = logging.getLogger("shardq.worker.starter")

LOST, REJECTED, UNAVAILABLE = "lost", "rejected", "unavailable"

#: A start write's verdict on one job: STARTED or one of the three words
#: above, and the error behind REJECTED or UNAVAILABLE.
type Verdict = tuple[str, Exception | None]


class StartWrites:
    """The group-committed start write the executor threads share."""

    def __init__(
        self, store: WorkerStore, stats: Stats, worker_id: str, signal: "TestSignal[Collection[int]] | None" = None
    ) -> None:
        self.store = store
        # Each committed write's started ids, for tests (testsignal.py).
        self.signal = signal or TestSignal()
        self.stats = stats
        self.worker_id = worker_id
        self._lock = threading.Lock()
        # Jobs whose threads asked while a write was in flight: the next
        # group, and beside each job the lock its thread sleeps on. A
        # verdict lands in job.start_verdict before that lock is released;
        # released with no verdict, the thread writes the next group.
        self._asked: list[ClaimedJob] = []
        self._waiters: list[LockType] = []
        self._writing = False

    def start(self, job: ClaimedJob) -> Verdict:
        """Record that this thread begins ``job`` now; its verdict once the
        write that carried it has committed (or failed).

        Each waiting thread sleeps on a lock of its own, released once for
        it, not on a shared condition: a ``Condition.notify_all`` woke every
        thread of the group into a race for the condition's lock (and the
        GIL), a fifth of a no-op job's CPU (docs/benchmarks.md)."""
        lock = self._lock
        waiter: LockType | None = None
        with lock:
            if self._writing:
                waiter = mine = _allocate_lock()
                mine.acquire()
                self._asked.append(job)
                self._waiters.append(mine)
            else:
                # No write in flight (so none asked): this thread writes
                # its own job now.
                self._writing = True
        if waiter is None:
            group: list[ClaimedJob] = [job]
            waiters: list[LockType] = []
        else:
            waiter.acquire()
            if job.start_verdict is not None:
                return job.start_verdict
            # Released with no verdict: the write in flight ended and this
            # thread writes the next group, every job asked since (its own
            # first among them). _writing stayed set through the hand-over.
            with lock:
                group, self._asked = self._asked, []
                waiters, self._waiters = self._waiters, []
        # Threads of the group left waiting when the write raises (not a
        # database error: those are verdicts) hand their jobs back.
        verdicts: list[Verdict] = [(UNAVAILABLE, None)] * len(group)
        try:
            verdicts = self._write(group)
        finally:
            for each, verdict in zip(group, verdicts, strict=True):
                each.start_verdict = verdict
            with lock:
                if self._asked:
                    # The next group gathered: its first thread writes it.
                    leader: LockType | None = self._waiters[0]
                else:
                    self._writing = False
                    leader = None
            if leader is not None:
                leader.release()
            for each_waiter in waiters:
                if each_waiter is not waiter:
                    each_waiter.release()
        return verdicts[group.index(job)]

    def _write(self, jobs: list[ClaimedJob]) -> list[Verdict]:
        try:
            started, rejected = self.store.start_jobs(self.worker_id, jobs)
        except DatabaseUnavailable as exc:
            # The COMMIT may have landed with its answer lost: then the job is
            # RUNNING with an attempt counted yet never runs, and the next
            # owner's rescue counts it as a worker loss (at-least-once holds).
            self.stats.add("db_errors")
            logger.warning("start write failed; handing %s jobs back: %s", len(jobs), exc)
            time.sleep(0.05)  # the threads do not spin while the database is away
            return [(UNAVAILABLE, exc)] * len(jobs)
        refused: dict[int, StatementRejected] = {job.id: error for job, error in rejected}
        verdicts: list[Verdict] = []
        for job in jobs:
            row = started.get(job.id)
            if row is not None:
                # A hand-back before the task runs (the lease lapsed during
                # the write) takes the start back (return_jobs), restoring
                # the earlier attempt time.
                job.started, job.previous_attempt_at = True, job.last_attempted_at
                job.attempts = row["attempts"]
                job.status_rank = row["status_rank"]
                job.started_at = row["started_at"]
                job.last_attempted_at = row["last_attempted_at"]
                job.started_by = self.worker_id
                verdicts.append((STARTED, None))
            elif job.id in refused:
                verdicts.append((REJECTED, refused[job.id]))
            else:
                verdicts.append((LOST, None))
        self.stats.add("start_writes")
        self.stats.add("started", len(started))
        self.signal.signal(started.keys())
        return verdicts
