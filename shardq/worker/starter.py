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
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .jobs import STARTED, ClaimedJob
from .stats import Stats
from .testsignal import TestSignal

if TYPE_CHECKING:
    from .completer import Completer

logger = logging.getLogger("shardq.worker.starter")

LOST, REJECTED, UNAVAILABLE = "lost", "rejected", "unavailable"

#: A start write's verdict on one job: STARTED or one of the three words
#: above, and the error behind REJECTED or UNAVAILABLE.
type Verdict = tuple[str, Exception | None]


class Gather:
    """When a start write waits for more threads (the executor's answers)."""

    def __init__(self, seconds: Callable[[], float], others: Callable[[], int]) -> None:
        # How long to wait now (0: write at once).
        self.seconds = seconds
        # The other threads not asleep waiting for a job: those of them
        # not waiting here either may ask soon (running a task, or just
        # released by the last write); none left, the wait ends.
        self.others = others


class StartWrites:
    """The group-committed start write the executor threads share."""

    def __init__(
        self,
        store: WorkerStore,
        stats: Stats,
        worker_id: str,
        signal: "TestSignal[Collection[int]] | None" = None,
        acks: "Completer | None" = None,
        gather: "Gather | None" = None,
    ) -> None:
        self.store = store
        # The completer whose queued outcomes ride on each write (None: none).
        self.acks = acks
        # Whether (and how long) a thread about to write waits for the
        # threads still inside short tasks to ask too (None: never).
        self.gather = gather
        # The lock the writing thread sleeps on while it gathers (None: it
        # does not): the thread whose ask leaves no thread in a task wakes it.
        self._gathering: LockType | None = None
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
        gathered: LockType | None = None
        with lock:
            if self._writing:
                waiter = mine = _allocate_lock()
                mine.acquire()
                self._asked.append(job)
                self._waiters.append(mine)
                gathering = self._gathering
                if gathering is not None and self._busy() <= 0:
                    # The last thread the writer waits for: it writes now.
                    self._gathering, gathered = None, gathering
            else:
                # No write in flight (so none asked): this thread writes.
                self._writing = True
        if gathered is not None:
            gathered.release()
        if waiter is None:
            self._gather()
            with lock:
                group: list[ClaimedJob] = [job, *self._asked]
                waiters, self._asked, self._waiters = self._waiters, [], []
        else:
            waiter.acquire()
            if job.start_verdict is not None:
                return job.start_verdict
            # Released with no verdict: the write in flight ended and this
            # thread writes the next group, every job asked since (its own
            # first among them). _writing stayed set through the hand-over.
            self._gather()
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

    def _gather(self) -> None:
        """Before it writes, the writing thread waits (``gather.seconds()``
        at most) for the threads still inside short tasks to ask too: with
        no-op tasks on four threads a write carried one job, then three,
        each a statement; gathered, a group is every thread."""
        gather = self.gather
        if gather is None:
            return
        seconds = gather.seconds()
        if seconds <= 0:
            return
        mine = _allocate_lock()
        mine.acquire()
        with self._lock:
            if self._busy() <= 0:
                return
            self._gathering = mine
        mine.acquire(timeout=seconds)
        with self._lock:
            self._gathering = None

    def _busy(self) -> int:
        """Threads that may still ask before this write (caller holds _lock)."""
        return 0 if self.gather is None else self.gather.others() - len(self._asked)

    def _write(self, jobs: list[ClaimedJob]) -> list[Verdict]:
        acks = self.acks
        riders = acks.take_ride(jobs) if acks is not None else []
        if riders:
            assert acks is not None
            # The queued outcomes ride on this write: one statement, and no
            # ack statement (or wake) of the completer's for them.
            try:
                started, applied, parents = self.store.complete_and_start_jobs(self.worker_id, jobs, riders)
            except StatementRejected:
                # A value PostgreSQL refused, in an outcome or a row: each
                # part goes its own way, which finds the bad one (split).
                acks.ride_back(riders)
            except DatabaseUnavailable as exc:
                # The answer is lost: the completer sends the outcomes
                # again and checks what landed (ack_uncertain).
                acks.ride_back(riders, uncertain=True)
                return self._unavailable(jobs, exc)
            else:
                acks.rode(riders, applied, parents)
                return self._verdicts(jobs, started, {})
        try:
            started, rejected = self.store.start_jobs(self.worker_id, jobs)
        except DatabaseUnavailable as exc:
            # The COMMIT may have landed with its answer lost: then the job is
            # RUNNING with an attempt counted yet never runs, and the next
            # owner's rescue counts it as a worker loss (at-least-once holds).
            return self._unavailable(jobs, exc)
        return self._verdicts(jobs, started, {job.id: error for job, error in rejected})

    def _unavailable(self, jobs: list[ClaimedJob], exc: DatabaseUnavailable) -> list[Verdict]:
        self.stats.add("db_errors")
        logger.warning("start write failed; handing %s jobs back: %s", len(jobs), exc)
        time.sleep(0.05)  # the threads do not spin while the database is away
        return [(UNAVAILABLE, exc)] * len(jobs)

    def _verdicts(
        self, jobs: list[ClaimedJob], started: dict[int, dict], refused: dict[int, StatementRejected]
    ) -> list[Verdict]:
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
