"""Run control: task timeouts, cooperative cancellation and zombie threads.

The executor registers an attempt (``begin``) before it calls a task that has
a time limit or can observe a cancel (``takes_context``, or ``async def``),
and ends it (``end``) when the call is over. This service's thread watches
the registered attempts.

State of one attempt, every change under its own lock::

    RUNNING --(deadline)--> TIMED_OUT --(the thread leaves the task)--> DONE
    RUNNING --(the thread leaves the task)--> DONE

At the deadline (``_expire``), under the attempt's lock and only if it is
still RUNNING: the attempt's outcome is queued for the completer (FAILED with
``TaskTimeout``, or READY for a retry while attempts remain; the executor's
``on_deadline`` builds it) under the attempt's fence and rank, ``expired``
is set for good, and then

* an async task's future is cancelled (the coroutine gets ``CancelledError``
  at its next ``await``; the executor thread waiting on it is free at once);
* a sync task's thread gets ``TaskTimeout`` as an asynchronous exception
  (``PyThreadState_SetAsyncExc``), raised at its next bytecode. It is sent
  again every second while the thread stays in the task (a task may swallow
  one in a broad ``except``).

Why the lock: an asynchronous exception must never hit shardq's own code
after the task returned. The injection happens only under the lock and only
in state TIMED_OUT; ``end`` takes the same lock to move to DONE and clears a
pending exception of its own thread. One already raised between the task's
return and ``end`` is caught by the executor's retry loop around ``end``;
``expired`` (never reset), not the exception, says what happened.

The late write. The executor drops whatever a timed-out attempt produced
afterwards (``late_completions_refused``); the database would refuse it too,
since the timeout outcome carries the same rank. ``complete_in_transaction``
raises ``TaskTimeout`` once the deadline has passed.

Zombies. A thread stuck in C code (``time.sleep(3600)``, a blocking read)
cannot be interrupted: the exception waits for it. Such an attempt, timed
out for over ZOMBIE_AFTER_SECONDS, is a zombie: its outcome is written, it
keeps its executor slot (the job stays in the buffer's processing set, so the
worker claims one job fewer), and it is counted (``zombies`` in the worker's
stats: ``shardq_status``, the admin's worker page). Past
``SHARDQ["MAX_ZOMBIES"]`` zombies, with every executor thread a zombie, or
with one older than ``SHARDQ["ZOMBIE_GRACE"]``, ``recycle_reason`` is set:
the worker stops claiming, hands buffered jobs back, lets the other running
jobs finish, writes every outcome, releases its leases and exits
``EXIT_RECYCLE`` for its supervisor to start a fresh process.

Cancellation is cooperative. ``shardq.cancel()`` of a RUNNING job sends
NOTIFY ``shardq_cancel`` with the job id; the listener hands it here, and
when the id is an attempt running here that can observe it, one statement
(``cancelled_attempts``) confirms it (a payload is never trusted: anyone may
NOTIFY). Without NOTIFY the same statement runs every heartbeat while such
attempts run. A confirmed cancel sets the attempt's ``cancelled`` flag
(``context.is_cancelled()`` reads it: no I/O) and cancels an async task's
future. The job's outcome was written by ``cancel`` itself.
"""

import ctypes
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, TaskTimeout
from .service import Service
from .stats import Stats

if TYPE_CHECKING:
    from .jobs import ClaimedJob

logger = logging.getLogger("shardq.worker.runcontrol")

RUNNING, TIMED_OUT, DONE = "running", "timed_out", "done"

# A timed-out sync attempt still in its task this long after the deadline
# is a zombie (a pure-Python loop stops within microseconds of the deadline).
ZOMBIE_AFTER_SECONDS = 1.0
# TaskTimeout is sent again this often while a timed-out thread stays in the task.
REINJECT_SECONDS = 1.0
# The exit code of a worker process replaced because of zombies.
EXIT_RECYCLE = 3
# Cancel checks triggered by NOTIFY, at most this often (payloads are untrusted).
CANCEL_CHECK_SECONDS = 0.005

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


class Attempt:
    """One running attempt under run control (see the module docstring)."""

    __slots__ = (
        "job",
        "task",
        "rank",
        "thread_id",
        "timeout_seconds",
        "deadline",
        "deadline_at",
        "is_async",
        "observes_cancel",
        "future",
        "state",
        "expired",
        "cancelled",
        "injected_at",
        "reported",
        "lock",
    )

    def __init__(
        self,
        job: "ClaimedJob",
        task: Any,
        rank: int,
        timeout_seconds: float | None,
        now: float,
        *,
        is_async: bool,
        observes_cancel: bool,
    ) -> None:
        self.job = job
        self.task = task
        self.rank = rank
        self.thread_id = threading.get_ident()
        self.timeout_seconds = timeout_seconds
        self.deadline = None if timeout_seconds is None else now + timeout_seconds
        self.deadline_at: datetime | None = (
            None if timeout_seconds is None else timezone.now() + timedelta(seconds=timeout_seconds)
        )
        self.is_async = is_async
        self.observes_cancel = observes_cancel
        self.future: Future | None = None
        self.state = RUNNING
        self.expired = False  # set at the deadline, never reset
        self.cancelled = False  # set once a cancel is confirmed by the table
        self.injected_at = 0.0
        self.reported = False  # logged as a zombie
        self.lock = threading.Lock()

    def time_left(self, now: float | None = None) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - (time.monotonic() if now is None else now)


class RunControl(Service):
    """The run-control thread (the module docstring), a worker Service."""

    name = "runcontrol"

    def __init__(
        self,
        store: WorkerStore,
        stats: Stats,
        *,
        on_deadline: Callable[[Attempt], None],
        poll_seconds: float,
        max_zombies: int,
        zombie_grace_seconds: float,
        concurrency: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.store = store
        self.stats = stats
        self.on_deadline = on_deadline
        self.poll_seconds = poll_seconds
        self.max_zombies = max_zombies
        self.zombie_grace_seconds = zombie_grace_seconds
        self.concurrency = concurrency
        self.clock = clock
        self._lock = threading.Lock()
        self._attempts: dict[int, Attempt] = {}  # by job id: a job runs once at a time here
        self._deadlines: list[tuple[float, int, Attempt]] = []
        self._sequence = itertools.count()
        self._next_wake = float("inf")
        self._wake = threading.Event()
        self._check_cancels = False
        self._last_cancel_check = 0.0
        # Why this process should be replaced (zombies), once that is so.
        self.recycle_reason: str | None = None
        self.zombie_count = 0

    # -- from executor threads -----------------------------------------------------

    def begin(
        self,
        job: "ClaimedJob",
        task: Any,
        rank: int,
        timeout_seconds: float | None,
        *,
        is_async: bool,
        observes_cancel: bool,
    ) -> Attempt:
        now = self.clock()
        attempt = Attempt(job, task, rank, timeout_seconds, now, is_async=is_async, observes_cancel=observes_cancel)
        with self._lock:
            self._attempts[job.id] = attempt
            if attempt.deadline is not None:
                heapq.heappush(self._deadlines, (attempt.deadline, next(self._sequence), attempt))
                wake = attempt.deadline < self._next_wake
            else:
                wake = False
        if wake:  # only when it moves the thread's next wake earlier: no wake-up per job
            self._wake.set()
        return attempt

    def attach(self, attempt: Attempt, future: Future) -> None:
        """An async attempt's future, once submitted to the loop."""
        with attempt.lock:
            attempt.future = future
            if attempt.state == TIMED_OUT or attempt.cancelled:
                future.cancel()

    def end(self, attempt: Attempt) -> bool:
        """The executor thread has left the task. True when the attempt had
        timed out (its outcome is written already; what the thread produced
        now is refused). Safe to call again: the executor calls it in a loop
        until it returns, since a TaskTimeout may be raised inside it."""
        with attempt.lock:
            attempt.state = DONE
            if attempt.expired and not attempt.is_async:
                # A TaskTimeout sent but not raised yet must not hit shardq's
                # code: no other can be sent now that the state is DONE.
                _set_async_exc(attempt.thread_id, ctypes.py_object())
        with self._lock:
            if self._attempts.get(attempt.job.id) is attempt:
                del self._attempts[attempt.job.id]
        return attempt.expired

    # -- from the listener ---------------------------------------------------------

    def notified(self, payload: str) -> None:
        """A NOTIFY on the cancel channel: check the table soon when it names
        an attempt running here that can observe a cancel."""
        if not (payload.isascii() and payload.isdigit() and len(payload) <= 19):
            self.stats.add("bad_notifies")
            return
        attempt = self._attempts.get(int(payload))
        if attempt is not None and attempt.observes_cancel and not attempt.cancelled:
            self._check_cancels = True
            self._wake.set()

    # -- the thread ---------------------------------------------------------------

    def interrupt(self) -> None:
        self._wake.set()

    def run(self) -> None:
        next_poll = self.clock() + self.poll_seconds
        while not self.stopping:
            now = self.clock()
            self._expire_due(now)
            self._reinject(now)
            if self._check_cancels and now - self._last_cancel_check >= CANCEL_CHECK_SECONDS:
                self._poll_cancels(now)
            elif now >= next_poll:
                self._poll_cancels(now)
                next_poll = now + self.poll_seconds
            self._count_zombies(now)
            wait = min(next_poll - now, 0.25 if self._any_timed_out() else 1.0)
            if self._check_cancels:
                wait = min(wait, CANCEL_CHECK_SECONDS)
            with self._lock:
                if self._deadlines:
                    wait = min(wait, self._deadlines[0][0] - now)
                self._next_wake = now + max(0.0, wait)
            self._wake.wait(max(0.0, wait))
            self._wake.clear()

    def _expire_due(self, now: float) -> None:
        due = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                due.append(heapq.heappop(self._deadlines)[2])
        for attempt in due:
            self._expire(attempt, now)

    def _expire(self, attempt: Attempt, now: float) -> None:
        with attempt.lock:
            if attempt.state != RUNNING:
                return  # it finished in time
            attempt.state = TIMED_OUT
            attempt.expired = True
            # Queued before anything is raised in the task: whatever the
            # thread does next, the attempt's outcome is this one.
            self.on_deadline(attempt)
            if attempt.is_async:
                if attempt.future is not None:
                    attempt.future.cancel()
            else:
                _set_async_exc(attempt.thread_id, TaskTimeout)
                attempt.injected_at = now
        self.stats.add("timeouts")

    def _reinject(self, now: float) -> None:
        for attempt in self._timed_out():
            if attempt.is_async or now - attempt.injected_at < REINJECT_SECONDS:
                continue
            with attempt.lock:
                if attempt.state == TIMED_OUT:
                    _set_async_exc(attempt.thread_id, TaskTimeout)
                    attempt.injected_at = now

    def _timed_out(self) -> list[Attempt]:
        with self._lock:
            return [a for a in self._attempts.values() if a.state == TIMED_OUT]

    def _any_timed_out(self) -> bool:
        with self._lock:
            return any(a.state == TIMED_OUT for a in self._attempts.values())

    def _poll_cancels(self, now: float) -> None:
        self._check_cancels = False
        self._last_cancel_check = now
        with self._lock:
            watched = [
                a for a in self._attempts.values() if a.observes_cancel and a.state == RUNNING and not a.cancelled
            ]
        if not watched:
            return
        try:
            cancelled = self.store.cancelled_attempts([(a.job.id, a.rank) for a in watched])
        except DatabaseUnavailable as exc:
            self.stats.add("db_errors")
            logger.info("could not check for cancelled jobs (%s); trying again at the next heartbeat", exc)
            return
        for attempt in watched:
            if attempt.job.id not in cancelled:
                continue
            with attempt.lock:
                attempt.cancelled = True
                if attempt.is_async and attempt.future is not None:
                    attempt.future.cancel()
            self.stats.add("cancels_seen")
            logger.info("job %s was cancelled while running: the task is told", attempt.job.id)

    # -- zombies ------------------------------------------------------------------

    def zombies(self, now: float | None = None) -> list[Attempt]:
        """Timed-out sync attempts whose thread is still in the task."""
        now = self.clock() if now is None else now
        return [
            a
            for a in self._timed_out()
            if not a.is_async and a.deadline is not None and now - a.deadline >= ZOMBIE_AFTER_SECONDS
        ]

    def zombie_threads(self) -> set[int]:
        return {a.thread_id for a in self.zombies()}

    def zombies_in_shard(self, shard: int) -> int:
        return sum(1 for a in self.zombies() if a.job.shard == shard)

    def _count_zombies(self, now: float) -> None:
        zombies = self.zombies(now)
        for a in zombies:
            if not a.reported:
                a.reported = True
                logger.warning(
                    "job %s (%s) is still running %.1fs past its timeout of %gs: its thread is stuck "
                    "(in C code?) and kept as a zombie; the job's outcome is written",
                    a.job.id,
                    a.job.task_path,
                    now - (a.deadline or now),
                    a.timeout_seconds,
                )
        if len(zombies) != self.zombie_count:
            self.zombie_count = len(zombies)
            self.stats.set("zombies", self.zombie_count)
        if self.recycle_reason is not None or not zombies:
            return
        oldest = max(now - (a.deadline or now) for a in zombies)
        if len(zombies) > self.max_zombies:
            reason = f"{len(zombies)} zombie threads, over SHARDQ['MAX_ZOMBIES'] = {self.max_zombies}"
        elif len(zombies) >= self.concurrency:
            reason = f"every executor thread ({self.concurrency}) is a zombie"
        elif oldest > self.zombie_grace_seconds:
            reason = (
                f"a zombie thread has been stuck {oldest:.0f}s past its timeout, over "
                f"SHARDQ['ZOMBIE_GRACE'] = {self.zombie_grace_seconds:g}s"
            )
        else:
            return
        self.recycle_reason = reason
