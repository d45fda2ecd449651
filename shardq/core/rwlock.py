"""A read-write lock with writer priority and cancellable timed waits.

Used where many threads read a structure that changes rarely (the worker's
view of the shards it holds: every fetch and every completion reads it, the
leaser rewrites it once a heartbeat).

State model (all fields guarded by one short-held mutex):

* ``readers`` — readers inside; ``writer`` — whether a writer is inside.
* ``writers_waiting`` / ``readers_waiting`` — FIFO queues of parked threads,
  each an ``OrderedDict`` of per-waiter locks.

Rules:

1. A reader enters at once when no writer is inside **and none is waiting**
   (writer priority: a stream of readers cannot starve a writer).
2. A writer enters at once when nobody is inside and no writer is waiting.
3. When the last reader leaves, the first waiting writer is let in.
4. When a writer leaves, every reader that was already waiting is let in as
   one batch, or, if none waits, the next writer. Alternating phases this way
   means neither side starves the other.
5. Hand-off: the releasing thread updates the state *on behalf of* the thread
   it wakes (``readers += 1`` or ``writer = True``) and then releases that
   waiter's private lock, so no third thread can slip in between.

Timeouts: a waiter parks on its own pre-acquired lock with
``Lock.acquire(timeout=...)``. On timeout it takes the mutex and removes its
entry from the queue — O(1) by key in the ``OrderedDict`` (unlike
``threading.Condition``, whose timed-out waiter is removed from a deque in
O(n)). If the entry is already gone, a releaser granted the lock in the
instant between the timeout and the mutex: the waiter then owns it and
reports success rather than leaking it. A cancelled writer may unblock the
readers that were queued behind it; it re-runs the grant rules.

The uncontended paths are one mutex acquire/release and two tests. The lock
is not reentrant, and a thread holding it for reading must not ask to write.
"""

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from threading import Lock

__all__ = ["RWLock"]


class RWLock:
    """Many readers or one writer; writers are preferred over new readers."""

    __slots__ = ("_mutex", "_readers", "_readers_waiting", "_writer", "_writers_waiting")

    def __init__(self) -> None:
        self._mutex = Lock()
        self._readers = 0
        self._writer = False
        self._writers_waiting: OrderedDict[Lock, None] = OrderedDict()
        self._readers_waiting: OrderedDict[Lock, None] = OrderedDict()

    # -- introspection (racy by nature; for tests and metrics) --------------
    @property
    def readers(self) -> int:
        return self._readers

    @property
    def writer_active(self) -> bool:
        return self._writer

    @property
    def waiting(self) -> tuple[int, int]:
        """``(readers_waiting, writers_waiting)``."""
        return len(self._readers_waiting), len(self._writers_waiting)

    # -- readers -------------------------------------------------------------
    def acquire_read(self, timeout: float | None = None) -> bool:
        """Enter as a reader; False if ``timeout`` seconds passed first."""
        mutex = self._mutex
        with mutex:
            if not self._writer and not self._writers_waiting:
                self._readers += 1
                return True
            if timeout is not None and timeout <= 0:
                return False
            waiter = Lock()
            waiter.acquire()
            self._readers_waiting[waiter] = None
        return self._park(waiter, self._readers_waiting, timeout)

    def release_read(self) -> None:
        with self._mutex:
            if self._readers <= 0:
                raise RuntimeError("release_read() without a matching acquire_read()")
            self._readers -= 1
            if self._readers == 0 and self._writers_waiting:
                self._grant_writer()

    # -- writers -------------------------------------------------------------
    def acquire_write(self, timeout: float | None = None) -> bool:
        """Enter as the writer; False if ``timeout`` seconds passed first."""
        with self._mutex:
            if not self._writer and not self._readers and not self._writers_waiting:
                self._writer = True
                return True
            if timeout is not None and timeout <= 0:
                return False
            waiter = Lock()
            waiter.acquire()
            self._writers_waiting[waiter] = None
        return self._park(waiter, self._writers_waiting, timeout)

    def release_write(self) -> None:
        with self._mutex:
            if not self._writer:
                raise RuntimeError("release_write() without a matching acquire_write()")
            self._writer = False
            if self._readers_waiting:
                self._grant_readers()
            elif self._writers_waiting:
                self._grant_writer()

    # -- context managers ----------------------------------------------------
    @contextmanager
    def read_locked(self, timeout: float | None = None) -> Iterator["RWLock"]:
        """``with lock.read_locked():`` — raises TimeoutError on timeout."""
        if not self.acquire_read(timeout):
            raise TimeoutError(f"read lock not acquired within {timeout} s")
        try:
            yield self
        finally:
            self.release_read()

    @contextmanager
    def write_locked(self, timeout: float | None = None) -> Iterator["RWLock"]:
        """``with lock.write_locked():`` — raises TimeoutError on timeout."""
        if not self.acquire_write(timeout):
            raise TimeoutError(f"write lock not acquired within {timeout} s")
        try:
            yield self
        finally:
            self.release_write()

    # -- internals (called with the mutex held) ------------------------------
    def _grant_writer(self) -> None:
        waiter, _ = self._writers_waiting.popitem(last=False)
        self._writer = True  # hand-off: state changes on the waiter's behalf
        waiter.release()

    def _grant_readers(self) -> None:
        waiting = self._readers_waiting
        self._readers += len(waiting)
        for waiter in waiting:
            waiter.release()
        waiting.clear()

    def _park(self, waiter: Lock, queue: OrderedDict[Lock, None], timeout: float | None) -> bool:
        if waiter.acquire(True, -1 if timeout is None else timeout):
            return True
        with self._mutex:
            if waiter not in queue:
                # Granted between our timeout and taking the mutex: we own it.
                return True
            del queue[waiter]  # O(1) cancellation
            # A cancelled writer may have been all that held readers back.
            if not self._writer:
                if self._writers_waiting:
                    if not self._readers:
                        self._grant_writer()
                elif self._readers_waiting:
                    self._grant_readers()
            return False
