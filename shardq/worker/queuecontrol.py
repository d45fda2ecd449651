"""A worker's copy of the live queue controls (shardq/queues.py).

The fetcher reads ``shardq_queue_control`` (``queue_controls``) before its
first claim, whenever a NOTIFY on ``<CHANNEL>_queue`` says it changed (the
payload only wakes: any database login can NOTIFY, so the table is the
truth), and at every poll interval, the fallback for a lost notification.
Each round the fetcher leaves out of its claims (``exclude_queues``) every
paused queue and every queue whose concurrency override is reached by the
jobs of it this worker holds (buffered or running); a queue newly paused has
its buffered, not started jobs handed back.
"""

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence


class QueueControls:
    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.paused: frozenset[str] = frozenset()
        self.caps: dict[str, int] = {}
        self.loaded_at = -math.inf
        self._stale = threading.Event()
        self._stale.set()  # read before the first claim
        # Reads done (for tests and the stats).
        self.loads = 0

    def notified(self, payload: str) -> None:
        """A NOTIFY said the controls changed: read them at the next round."""
        self._stale.set()

    def refresh_due(self) -> bool:
        return self._stale.is_set() or self.clock() - self.loaded_at >= self.interval

    def load(self, rows: Iterable[Sequence[object]]) -> frozenset[str]:
        """Take the table's rows (queue_name, paused, concurrency); returns
        the queues paused by this read that were not before."""
        # The caller cleared the stale flag before its read (begin_load): a
        # NOTIFY that came during the read asks for one more.
        paused = frozenset(str(row[0]) for row in rows if row[1])
        caps = {str(row[0]): int(row[2]) for row in rows if row[2] is not None}  # type: ignore[call-overload]
        newly = paused - self.paused
        self.paused, self.caps = paused, caps
        self.loaded_at = self.clock()
        self.loads += 1
        return newly

    def begin_load(self) -> None:
        """Called just before the read: a NOTIFY from now on asks for another."""
        self._stale.clear()

    def load_failed(self) -> None:
        self._stale.set()

    def blocked(self, held_by_queue: Callable[[], dict[str, int]]) -> list[str]:
        """Queues the next claim must leave out: paused, or at their
        concurrency override here (``held_by_queue`` is only called when an
        override exists)."""
        if not self.caps:
            return sorted(self.paused)
        held = held_by_queue()
        full = {queue for queue, cap in self.caps.items() if held.get(queue, 0) >= cap}
        return sorted(self.paused | full)
