"""The starter: claimed is not started (DESIGN §5, "the lifecycle tells the truth").

A claimed job waits in the buffer as CLAIMED. The starter thread takes the
jobs the executors are about to run, in the buffer's order, and records
their start in one statement (``start_jobs``): the row becomes RUNNING, the
attempt is counted and ``started_at``, ``last_attempted_at`` and this worker
in ``worker_ids`` are written. Only then does an executor thread run the
task. So a crash never charges an attempt to a job that did not start: the
next owner's rescue finds it CLAIMED and puts it back READY for free.

How far ahead it starts (``wanted``): for tasks that take longer than
AHEAD_SECONDS, only as many jobs as executor threads are idle, so nothing
started waits; for shorter tasks, about AHEAD_SECONDS of the threads' work
(wall time, at most AHEAD_MAX jobs), so the executors never wait for a round
trip and a crash costs at most that much work one worker loss each (run
again, at-least-once). When those are the jobs a claim brings, the claim
starts them itself (``Worker.start_now``, ``claim_jobs``' ``start``): they
arrive started (``job.started``) and pass through here without a write.

Started jobs wait best first (priority, then the order they were started),
not in a FIFO, and a claim that brings a job outranking the lowest one
waiting started (``expedite``, called by the fetcher) has the starter start
the buffered jobs that outrank it at once, out of turn, up to ``wanted``:
they then run as soon as a thread is free. Without that, a priority-100 job
enqueued behind a backlog of no-op jobs waited behind every job started
ahead of it (p50 72 ms, p99 137-158 ms with 10,000 waiting; measured,
``docs/benchmarks.md``, "Priority"). Long tasks start nothing ahead
(``wanted`` is the idle threads), so there is nothing to overtake.

The write is fenced like an ack (the claim's fence and rank, the shard not
handed over since): a job whose claim was superseded (a takeover rescued it)
is not run here.

State model of a job in this worker: buffered (CLAIMED) -> ready (RUNNING,
attempt counted) -> processing (the task runs) -> outcome queued (completer).
"""

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected, UnknownTask
from ..tasks import resolve
from .buffer import Buffer
from .fetcher import Fetcher
from .handback import HandBack
from .jobs import STARTED, ClaimedJob
from .leaser import Leaser
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.starter")

LOST, REJECTED, UNAVAILABLE = "lost", "rejected", "unavailable"

#: A start write's verdict on one job: one of the four words above, and the
#: error behind REJECTED or UNAVAILABLE.
type Verdict = tuple[str, Exception | None]

AHEAD_SECONDS = 0.02
AHEAD_MAX = 1024


class Starter(Service):
    name = "starter"

    def __init__(
        self,
        store: WorkerStore,
        stats: Stats,
        *,
        worker_id: str,
        buffer: Buffer,
        leaser: Leaser,
        handback: HandBack,
        fetcher: Fetcher,
        concurrency: int,
        task_seconds: Callable[[], float | None],
        task_modules: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.store = store
        self.stats = stats
        self.worker_id = worker_id
        self.buffer = buffer
        self.leaser = leaser
        self.handback = handback
        self.fetcher = fetcher
        self.concurrency = concurrency
        self.task_seconds = task_seconds  # () -> the executors' average task time (None: none yet)
        self.task_modules = task_modules
        # One lock, two conditions: executors wait for jobs, the starter for
        # room (so a take() wakes the starter only, never the other threads).
        self._lock = threading.Lock()
        self._jobs = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        # Started jobs, best first: (-priority, sequence, job); the sequence
        # keeps the buffer's order among equals. Their priorities are counted
        # (the lowest is what a new job must outrank).
        self._ready: list[tuple[int, int, ClaimedJob]] = []
        self._ready_priorities: Counter[int] = Counter()
        self._sequence = itertools.count()
        # Jobs taken out of turn (see expedite) that still need a start write:
        # this thread writes it, before any refill.
        self._out_of_turn: list[ClaimedJob] = []
        self._idle = 0  # executor threads waiting in take() (for _jobs)
        self._refill_waiting = False  # the starter waits for room (_room)
        self._low_water = 0  # refill once the ready jobs fall to this
        self._fails_on_loss: dict[str, bool] = {}  # task path -> on_worker_lost == "fail"

    # -- executor side -------------------------------------------------------------

    def take(self, timeout: float) -> ClaimedJob | None:
        """The next job to run (its start recorded, see ``verdict_of``), or None."""
        with self._lock:
            ready = self._ready
            if not ready:
                self._idle += 1
                if self._refill_waiting:
                    self._room.notify()
                try:
                    self._jobs.wait(timeout)
                finally:
                    self._idle -= 1
                if not ready:
                    return None
            job = heapq.heappop(ready)[2]
            self._uncount(job.priority)
            # Notified only while the starter waits for room: a notify with
            # nobody waiting still costs a lock probe and a deque, per job.
            if self._refill_waiting and len(ready) <= self._low_water:
                self._room.notify()
            return job

    @property
    def ready(self) -> int:
        return len(self._ready)

    def lowest_ready(self) -> int | None:
        """The lowest priority of a started job waiting for a thread (None:
        none). A snapshot without the lock, as Buffer.lowest_priority: the
        executors take the lock once per job."""
        return min(self._ready_priorities, default=None)

    def expedite(self, priority: int) -> None:
        """A claim brought jobs of up to ``priority`` (called by the fetcher
        once they are buffered): if that outranks a started job waiting
        here, the buffered jobs that outrank the lowest of them are started
        now, out of turn, rather than at the next refill, and so run next.

        Only jobs above the lowest started one gain by going out of turn, and
        at most ``wanted`` (none for long tasks: a started job must not wait
        a whole task for a thread). Jobs the claim started go to the threads
        from the caller's thread (no write, and no hand-over to this thread
        on the way: the fetcher's claim for outranking jobs starts them, see
        Worker.outranking_claim); the others are written by the starter
        thread before its next refill.
        """
        with self._lock:
            priorities = self._ready_priorities
            if not priorities or priority <= min(priorities):
                return
            floor = min(priorities) + 1
            limit = self.wanted()
        jobs = self.buffer.pop_more(limit, min_priority=floor) if limit > 0 else []
        if not jobs:
            return
        started = [job for job in jobs if job.started]
        if started:
            self.start_jobs(started)  # writes nothing: every one is started
        self.stats.add("started_out_of_turn", len(jobs))
        if len(started) < len(jobs):
            with self._lock:
                self._out_of_turn.extend(job for job in jobs if not job.started)
                self._room.notify()
            self.buffer.wake_all()  # the starter may be waiting for a buffered job

    def _uncount(self, priority: int) -> None:
        """One started job of ``priority`` fewer waiting (caller holds _lock)."""
        left = self._ready_priorities[priority] - 1
        if left:
            self._ready_priorities[priority] = left
        else:
            del self._ready_priorities[priority]

    def starts_ahead(self) -> bool:
        """Does the starter start jobs before a thread is free (short tasks)?"""
        seconds = self.task_seconds()
        return seconds is not None and seconds < AHEAD_SECONDS

    def wanted(self) -> int:
        """How many started jobs to keep ready for the executors."""
        seconds = self.task_seconds()
        if seconds is None or seconds >= AHEAD_SECONDS:
            # Long tasks, or none measured yet (a first claim of three
            # one-second tasks must not show all three RUNNING).
            return self._idle
        return min(AHEAD_MAX, max(self.concurrency, int(self.concurrency * AHEAD_SECONDS / max(seconds, 1e-6))))

    # -- the thread ----------------------------------------------------------------

    def interrupt(self) -> None:
        """Start nothing more (jobs already started stay ready to run)."""
        with self._lock:
            self._room.notify_all()
            self._jobs.notify_all()
        self.buffer.wake_all()

    def run(self) -> None:
        while not self.stopping:
            with self._lock:
                out_of_turn, self._out_of_turn = self._out_of_turn, []
            if out_of_turn:
                self.start_jobs(out_of_turn)
                continue
            with self._lock:
                wanted = self.wanted()
                # Refill once half is used, not job by job: one start
                # write for many jobs.
                self._low_water = wanted // 2
                if len(self._ready) > self._low_water or wanted <= 0:
                    self._refill_waiting = True
                    try:
                        self._room.wait(0.1)
                    finally:
                        self._refill_waiting = False
                    continue
                room = wanted - len(self._ready)
            job = self.buffer.pop(timeout=0.1)
            if job is None:
                continue
            jobs = [job]
            if job.started and room > 1 and self._idle:
                # The best job, started by its claim, goes to a waiting
                # thread at once, not after the group is popped.
                self.start_jobs(jobs)
                jobs = []
            jobs += self.buffer.pop_more(room - 1)
            if jobs:
                self.start_jobs(jobs)

    def start_jobs(self, jobs: list[ClaimedJob]) -> None:
        """Record the start of ``jobs`` (popped from the buffer) and make them
        ready, each with its verdict (``job.start_verdict``)."""
        startable, ready = [], []
        for job in jobs:
            if not self.leaser.trusts(job.shard, job.fence):
                # The lease is lost or unconfirmed: start nothing; hand the
                # claim back (rejected harmlessly if already rescued).
                self.handback.return_jobs([job])
                self.buffer.done(job)
                self.fetcher.slot_freed()
                continue
            ready.append(job)
            if not job.started and self._needs_start(job):
                startable.append(job)
        if startable:
            for job, verdict in zip(startable, self._write(startable), strict=False):
                job.start_verdict = verdict
        with self._lock:
            for job in ready:
                heapq.heappush(self._ready, (-job.priority, next(self._sequence), job))
            self._ready_priorities.update(job.priority for job in ready)
            if self._idle:  # the threads waiting in take()
                self._jobs.notify(min(len(ready), self._idle))

    def _needs_start(self, job: ClaimedJob) -> bool:
        """False for a job the executor fails without running: an unknown
        task, or an interrupted attempt of an on_worker_lost='fail' task."""
        fails_on_loss = self._fails_on_loss.get(job.task_path)
        if fails_on_loss is None:
            try:
                task = resolve(job.task_path, self.task_modules)
            except UnknownTask:
                return False  # not remembered: the module may yet be deployed
            fails_on_loss = self._fails_on_loss[job.task_path] = getattr(task, "on_worker_lost", "retry") == "fail"
        return not (job.worker_losses and fails_on_loss)

    def _write(self, jobs: list[ClaimedJob]) -> list[Verdict]:
        try:
            started, rejected = self.store.start_jobs(self.worker_id, jobs)
        except DatabaseUnavailable as exc:
            # The COMMIT may have landed with its answer lost: then the job is
            # RUNNING with an attempt counted yet never runs, and the next
            # owner's rescue counts it as a worker loss (at-least-once holds).
            self.stats.add("db_errors")
            logger.warning("start write failed; handing %s jobs back: %s", len(jobs), exc)
            time.sleep(0.05)  # do not spin while the database is away
            return [(UNAVAILABLE, exc)] * len(jobs)
        refused: dict[int, StatementRejected] = {job.id: error for job, error in rejected}
        verdicts: list[Verdict] = []
        for job in jobs:
            row = started.get(job.id)
            if row is not None:
                # As a claim's start: a hand-back before the task runs takes
                # it back (return_jobs), restoring the earlier attempt time.
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
        return verdicts
