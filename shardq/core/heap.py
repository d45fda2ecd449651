"""Indexed priority queues for the worker's lanes.

Order: highest ``priority`` first, then earliest ``run_after``, then FIFO by
``sequence`` (a counter; a lane may share one counter with other lanes so
FIFO holds across them). An entry is the tuple
``(-priority, run_after, sequence, item_id, item)``; sequences are unique, so
tuple comparison never reaches ``item_id`` or ``item``.

Index and lazy deletion: ``_index`` maps an item id to the sequence of its
live entry — the sequence is the entry's *generation*. ``remove`` deletes the
index entry in O(1) and leaves the heap entry in place, stale; ``pop`` and
``peek`` discard stale entries as they surface. Re-pushing an id makes its
old entry stale the same way. When more than 20% of the heap is stale it is
rebuilt in O(n) (compaction), so memory stays within 1.25× the live size.

Two implementations share the interface: :class:`QuaternaryIndexedQueue`, a
4-ary heap in pure Python (shallower tree, fewer comparisons per sift) and
:class:`HeapqIndexedQueue` on the C ``heapq`` module. ``bench/core.py``
measures both: heapq is 1.7–2.7× faster at 1k, 65k and 1M entries, so
:data:`FastestIndexedQueue` / :func:`make_indexed_queue` give the heapq version
(docs/benchmarks.md). Neither is thread-safe: the owner locks.
"""

from collections.abc import Hashable, Iterator
from heapq import heapify, heappop, heappush
from itertools import count

__all__ = [
    "COMPACT_STALE_RATIO",
    "FastestIndexedQueue",
    "HeapqIndexedQueue",
    "QuaternaryIndexedQueue",
    "make_indexed_queue",
]

#: Rebuild the heap when stale entries exceed this share of it.
COMPACT_STALE_RATIO = 0.20
# stale > ratio * len  <=>  stale * 5 > len for 0.20 (an integer test on the hot path)
_COMPACT_FACTOR = 5

#: A heap entry: ``(-priority, run_after, sequence, item_id, item)``.
type Entry[I, T] = tuple[int, float, int, I, T]


class _IndexedQueueBase[I: Hashable, T]:
    __slots__ = ("_counter", "_heap", "_index", "_stale")

    def __init__(self, counter: Iterator[int] | None = None) -> None:
        self._heap: list[Entry[I, T]] = []
        self._index: dict[I, int] = {}  # item id -> sequence (generation) of its live entry
        self._counter: Iterator[int] = count() if counter is None else counter
        self._stale = 0

    def __len__(self) -> int:
        return len(self._index)

    def __bool__(self) -> bool:
        return bool(self._index)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._index

    @property
    def stale(self) -> int:
        """Stale entries still held in the heap (for tests and metrics)."""
        return self._stale

    @property
    def heap_size(self) -> int:
        """Entries in the heap, live and stale."""
        return len(self._heap)

    def remove(self, item_id: I) -> bool:
        """Forget ``item_id`` in O(1); return True if it was queued.

        Its heap entry stays in place, stale, until it surfaces or compaction.
        """
        if self._index.pop(item_id, None) is None:
            return False
        self._stale += 1
        if self._stale * _COMPACT_FACTOR > len(self._heap):
            self._compact()
        return True

    def _compact(self) -> None:
        index = self._index
        heap = [e for e in self._heap if index.get(e[3]) == e[2]]
        self._heapify(heap)
        self._heap = heap
        self._stale = 0

    @staticmethod
    def _heapify(heap: list[Entry[I, T]]) -> None:
        heapify(heap)

    def clear(self) -> None:
        self._heap = []
        self._index.clear()
        self._stale = 0

    def items(self) -> list[T]:
        """Live items in priority order (O(n log n); for tests and draining)."""
        index = self._index
        live = sorted(e for e in self._heap if index.get(e[3]) == e[2])
        return [e[4] for e in live]


class HeapqIndexedQueue[I: Hashable, T](_IndexedQueueBase[I, T]):
    """Indexed priority queue on the C ``heapq`` module (binary heap)."""

    __slots__ = ()

    def push(self, item_id: I, priority: int, run_after: float, item: T) -> None:
        """Queue ``item``; an id already queued is replaced (old entry goes stale)."""
        seq = next(self._counter)
        index = self._index
        if item_id in index:
            self._stale += 1
        index[item_id] = seq
        heappush(self._heap, (-priority, run_after, seq, item_id, item))
        if self._stale and self._stale * _COMPACT_FACTOR > len(self._heap):
            self._compact()

    def peek(self) -> Entry[I, T] | None:
        """The best live entry ``(-priority, run_after, seq, id, item)`` or None."""
        heap = self._heap
        index = self._index
        while heap:
            top = heap[0]
            if index.get(top[3]) == top[2]:
                return top
            heappop(heap)
            self._stale -= 1
        return None

    def pop(self) -> T:
        """Remove and return the best live item; IndexError when empty."""
        heap = self._heap
        index = self._index
        while heap:
            top = heappop(heap)
            if index.get(top[3]) == top[2]:
                del index[top[3]]
                if self._stale and self._stale * _COMPACT_FACTOR > len(heap):
                    self._compact()
                return top[4]
            self._stale -= 1
        raise IndexError("pop from an empty queue")


class QuaternaryIndexedQueue[I: Hashable, T](_IndexedQueueBase[I, T]):
    """Indexed priority queue on a pure-Python 4-ary min-heap."""

    __slots__ = ()

    @classmethod
    def _heapify(cls, heap: list[Entry[I, T]]) -> None:
        sift_down = cls._sift_down
        for pos in range((len(heap) - 2) // 4, -1, -1):
            sift_down(heap, pos)

    @staticmethod
    def _sift_down[J, U](heap: list[Entry[J, U]], pos: int) -> None:
        n = len(heap)
        item = heap[pos]
        while True:
            child = 4 * pos + 1
            if child >= n:
                break
            best = heap[child]
            best_pos = child
            end = child + 4 if child + 4 < n else n
            c = child + 1
            while c < end:
                cand = heap[c]
                if cand < best:
                    best = cand
                    best_pos = c
                c += 1
            if best < item:
                heap[pos] = best
                pos = best_pos
            else:
                break
        heap[pos] = item

    def push(self, item_id: I, priority: int, run_after: float, item: T) -> None:
        """Queue ``item``; an id already queued is replaced (old entry goes stale)."""
        seq = next(self._counter)
        index = self._index
        if item_id in index:
            self._stale += 1
        index[item_id] = seq
        entry = (-priority, run_after, seq, item_id, item)
        heap = self._heap
        pos = len(heap)
        heap.append(entry)
        while pos:
            parent = (pos - 1) >> 2
            p = heap[parent]
            if entry < p:
                heap[pos] = p
                pos = parent
            else:
                break
        heap[pos] = entry
        if self._stale and self._stale * _COMPACT_FACTOR > len(heap):
            self._compact()

    def _pop_top(self, heap: list[Entry[I, T]]) -> Entry[I, T]:
        last = heap.pop()
        if heap:
            top = heap[0]
            heap[0] = last
            self._sift_down(heap, 0)
            return top
        return last

    def peek(self) -> Entry[I, T] | None:
        """The best live entry ``(-priority, run_after, seq, id, item)`` or None."""
        heap = self._heap
        index = self._index
        while heap:
            top = heap[0]
            if index.get(top[3]) == top[2]:
                return top
            self._pop_top(heap)
            self._stale -= 1
        return None

    def pop(self) -> T:
        """Remove and return the best live item; IndexError when empty."""
        heap = self._heap
        index = self._index
        while heap:
            top = self._pop_top(heap)
            if index.get(top[3]) == top[2]:
                del index[top[3]]
                if self._stale and self._stale * _COMPACT_FACTOR > len(heap):
                    self._compact()
                return top[4]
            self._stale -= 1
        raise IndexError("pop from an empty queue")


#: The implementation the runtime uses: the faster one as measured by
#: bench/core.py (docs/benchmarks.md, "In-memory structures").
FastestIndexedQueue = HeapqIndexedQueue


def make_indexed_queue[I: Hashable, T](counter: Iterator[int] | None = None) -> FastestIndexedQueue[I, T]:
    """A new indexed queue of the measured-fastest kind.

    ``counter`` (an ``itertools.count``) may be shared by several queues so
    FIFO order holds across them.
    """
    return FastestIndexedQueue(counter)
