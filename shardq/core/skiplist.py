"""Time-ordered index of delayed jobs: the worker's look-ahead.

A delayed job (``run_after`` in the future) waits here until it is due; the
local queue then range-pops *everything* due in one call (``pop_due(now)``)
and moves it to its lane. The operations the runtime needs are therefore:
insert, remove by id (a shard was dropped), earliest time (when to wake),
and pop-the-due-prefix.

Two implementations share the interface:

* :class:`SkipListDelayedIndex` — a skip list (p = 0.5) ordered by
  ``(time, sequence)`` with an id → node map. ``pop_due`` cuts the due
  prefix off the head in O(log n + k); ``remove`` is O(log n) expected.
* :class:`SortedListDelayedIndex` — ``sortedcontainers.SortedList`` of
  ``(time, sequence, id)`` plus a dict.

``bench/core.py`` measures both (docs/benchmarks.md): up to about two
thousand entries they are level (within ±5% across runs; one earlier run
had the skip list 1.2× ahead at 1k), from 4k SortedList is ahead (1.04× at
4k, 1.1× at 8k, 1.4× at 65k, 1.8× at 1M). :func:`make_delayed_index`
therefore picks by the size the owner expects — the local queue passes its
capacity (a few hundred jobs in a default worker), so the runtime uses the
skip list, and a worker configured with a larger buffer gets SortedList. Equal times pop in
insertion (FIFO) order. Not thread-safe: the owner locks.
"""

from collections.abc import Hashable
from itertools import count
from math import inf
from random import Random
from typing import Any, Protocol

from sortedcontainers import SortedList

__all__ = [
    "SKIPLIST_MAX_ENTRIES",
    "DelayedIndex",
    "SkipListDelayedIndex",
    "SortedListDelayedIndex",
    "delayed_index_class",
    "make_delayed_index",
]

_MAX_LEVEL = 32


class DelayedIndex[I: Hashable, T](Protocol):
    """The interface both implementations share."""

    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __contains__(self, item_id: object) -> bool: ...
    def add(self, item_id: I, time: float, item: T) -> None: ...
    def remove(self, item_id: I) -> bool: ...
    def next_time(self) -> float | None: ...
    def pop_due(self, now: float) -> list[T]: ...
    def items(self) -> list[T]: ...
    def clear(self) -> None: ...


class _Node[I, T]:
    __slots__ = ("id", "item", "next", "seq", "time")

    def __init__(self, time: float, seq: int, item_id: I, item: T, level: int) -> None:
        self.time = time
        self.seq = seq
        self.id = item_id
        self.item = item
        self.next: list[_Node[I, T] | None] = [None] * level


class SkipListDelayedIndex[I: Hashable, T]:
    """Skip list keyed by ``(time, sequence)`` with O(log n) remove by id."""

    __slots__ = ("_bits", "_counter", "_head", "_level", "_nodes")

    def __init__(self, seed: int | None = None) -> None:
        # The head sentinel carries no entry: its id and item are never read.
        head: _Node[Any, Any] = _Node(-inf, -1, None, None, _MAX_LEVEL)
        self._head: _Node[I, T] = head
        self._level = 1
        self._nodes: dict[I, _Node[I, T]] = {}
        self._counter = count()
        # A private generator: levels need no cryptographic quality, and a
        # seed makes a run reproducible.
        self._bits = Random(seed).getrandbits

    def __len__(self) -> int:
        return len(self._nodes)

    def __bool__(self) -> bool:
        return bool(self._nodes)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._nodes

    def add(self, item_id: I, time: float, item: T) -> None:
        """Index ``item`` under ``time``; an id already present is moved."""
        if item_id in self._nodes:
            self.remove(item_id)
        seq = next(self._counter)
        # Geometric level with p = 0.5: position of the lowest set bit.
        bits = self._bits(_MAX_LEVEL - 1) | (1 << (_MAX_LEVEL - 1))
        level = (bits & -bits).bit_length()
        head = self._head
        if level > self._level:
            self._level = level
        update: list[_Node[I, T]] = [head] * level
        x = head
        for lvl in range(self._level - 1, -1, -1):
            nxt = x.next[lvl]
            while nxt is not None and (nxt.time < time or (nxt.time == time and nxt.seq < seq)):
                x = nxt
                nxt = x.next[lvl]
            if lvl < level:
                update[lvl] = x
        node = _Node(time, seq, item_id, item, level)
        nexts = node.next
        for lvl in range(level):
            prev = update[lvl]
            nexts[lvl] = prev.next[lvl]
            prev.next[lvl] = node
        self._nodes[item_id] = node

    def remove(self, item_id: I) -> bool:
        """Remove ``item_id``; True if it was present. O(log n) expected."""
        node = self._nodes.pop(item_id, None)
        if node is None:
            return False
        time = node.time
        seq = node.seq
        x = self._head
        for lvl in range(self._level - 1, -1, -1):
            nxt = x.next[lvl]
            while nxt is not None and nxt is not node and (nxt.time < time or (nxt.time == time and nxt.seq < seq)):
                x = nxt
                nxt = x.next[lvl]
            if nxt is node:
                x.next[lvl] = node.next[lvl]
        self._shrink()
        return True

    def _shrink(self) -> None:
        head_next = self._head.next
        level = self._level
        while level > 1 and head_next[level - 1] is None:
            level -= 1
        self._level = level

    def next_time(self) -> float | None:
        """Earliest time indexed, or None when empty."""
        first = self._head.next[0]
        return None if first is None else first.time

    def pop_due(self, now: float) -> list[T]:
        """Remove and return every item with ``time <= now``, earliest first."""
        head = self._head
        first = head.next[0]
        if first is None or first.time > now:
            return []
        x = head
        head_next = head.next
        for lvl in range(self._level - 1, -1, -1):
            nxt = x.next[lvl]
            while nxt is not None and nxt.time <= now:
                x = nxt
                nxt = x.next[lvl]
            # Every node up to x at this level is due: cut the prefix off.
            head_next[lvl] = nxt
        stop = head_next[0]
        nodes = self._nodes
        out: list[T] = []
        node: _Node[I, T] | None = first
        while node is not None and node is not stop:  # stop is in the chain or None
            out.append(node.item)
            del nodes[node.id]
            node = node.next[0]
        self._shrink()
        return out

    def items(self) -> list[T]:
        """Items in time order (for tests and draining)."""
        out: list[T] = []
        node = self._head.next[0]
        while node is not None:
            out.append(node.item)
            node = node.next[0]
        return out

    def clear(self) -> None:
        head: _Node[Any, Any] = _Node(-inf, -1, None, None, _MAX_LEVEL)
        self._head = head
        self._level = 1
        self._nodes.clear()


class SortedListDelayedIndex[I: Hashable, T]:
    """The same interface on ``sortedcontainers.SortedList``."""

    __slots__ = ("_counter", "_entries", "_sorted")

    def __init__(self, seed: int | None = None) -> None:
        self._sorted = SortedList()  # of (time, seq, id)
        self._entries: dict[I, tuple[float, int, T]] = {}  # id -> (time, seq, item)
        self._counter = count()

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._entries

    def add(self, item_id: I, time: float, item: T) -> None:
        """Index ``item`` under ``time``; an id already present is moved."""
        if item_id in self._entries:
            self.remove(item_id)
        seq = next(self._counter)
        self._entries[item_id] = (time, seq, item)
        self._sorted.add((time, seq, item_id))

    def remove(self, item_id: I) -> bool:
        """Remove ``item_id``; True if it was present."""
        entry = self._entries.pop(item_id, None)
        if entry is None:
            return False
        self._sorted.remove((entry[0], entry[1], item_id))
        return True

    def next_time(self) -> float | None:
        """Earliest time indexed, or None when empty."""
        if not self._entries:
            return None
        first: float = self._sorted[0][0]
        return first

    def pop_due(self, now: float) -> list[T]:
        """Remove and return every item with ``time <= now``, earliest first."""
        sl = self._sorted
        if not sl or sl[0][0] > now:
            return []
        end = sl.bisect_right((now, inf))
        due = sl[:end]
        del sl[:end]
        entries = self._entries
        return [entries.pop(key[2])[2] for key in due]

    def items(self) -> list[T]:
        """Items in time order (for tests and draining)."""
        return [self._entries[key[2]][2] for key in self._sorted]

    def clear(self) -> None:
        self._sorted.clear()
        self._entries.clear()


#: Up to this many entries the skip list measured faster; above, SortedList.
SKIPLIST_MAX_ENTRIES = 2_048


def delayed_index_class(
    size_hint: int | None = None,
) -> type[SkipListDelayedIndex[Any, Any]] | type[SortedListDelayedIndex[Any, Any]]:
    """The measured-faster implementation for about ``size_hint`` entries."""
    if size_hint is not None and size_hint <= SKIPLIST_MAX_ENTRIES:
        return SkipListDelayedIndex
    return SortedListDelayedIndex


def make_delayed_index[I: Hashable, T](size_hint: int | None = None, seed: int | None = None) -> DelayedIndex[I, T]:
    """A new delayed-job index of the kind measured faster at ``size_hint``.

    Without a hint (unbounded use) SortedList is chosen: it degrades least.
    """
    return delayed_index_class(size_hint)(seed)
