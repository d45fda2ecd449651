"""Least-recently-used maps for finished results and recently seen unique keys.

The worker keeps the last N finished ``TaskResult``s (so ``get_result`` on a
job this process just ran needs no query) and the unique keys it enqueued
recently (so a burst of duplicates is refused without a round trip). Both
need O(1) ``get``/``set`` and eviction of the least recently used entry.

Two implementations share the interface:

* :class:`LinkedLRU` — a dict of nodes on a circular doubly linked list with
  a sentinel, in pure Python.
* :class:`OrderedDictLRU` — ``collections.OrderedDict`` (its C
  ``move_to_end`` / ``popitem(last=False)``).

``functools.lru_cache`` is only comparable for the get-or-compute pattern
and cannot store a value it did not compute nor expose eviction, so the
benchmark compares it on that pattern only. :data:`FastestLRU` /
:func:`make_lru` pick the faster (docs/benchmarks.md). Not thread-safe: the
owner locks.
"""

from collections import OrderedDict
from collections.abc import Hashable
from enum import Enum
from typing import Any, Final, overload

__all__ = ["FastestLRU", "LinkedLRU", "OrderedDictLRU", "make_lru"]


class _Missing(Enum):
    MISSING = 0


# An enum member rather than ``object()`` so that ``is _MISSING`` narrows the type.
_MISSING: Final = _Missing.MISSING


def _check_capacity(capacity: int) -> None:
    if capacity < 1:
        raise ValueError(f"LRU capacity must be at least 1, got {capacity!r}")


class _Link[K, V]:
    __slots__ = ("key", "next", "prev", "value")

    prev: "_Link[K, V]"
    next: "_Link[K, V]"
    key: K
    value: V


class LinkedLRU[K: Hashable, V]:
    """LRU map on a dict plus a circular doubly linked list."""

    __slots__ = ("_capacity", "_map", "_root")

    def __init__(self, capacity: int) -> None:
        _check_capacity(capacity)
        self._capacity = capacity
        self._map: dict[K, _Link[K, V]] = {}
        # The sentinel carries no entry: its key and value are never read.
        root: _Link[Any, Any] = _Link()
        root.prev = root.next = root
        root.key = root.value = None
        self._root: _Link[K, V] = root  # root.next is the least recent, root.prev the most

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        """Membership without touching recency."""
        return key in self._map

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get[D](self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        """Value of ``key`` (now the most recent) or ``default``."""
        link = self._map.get(key)
        if link is None:
            return default
        # unlink, then relink just before the root (most recent)
        prev = link.prev
        nxt = link.next
        prev.next = nxt
        nxt.prev = prev
        root = self._root
        last = root.prev
        last.next = link
        link.prev = last
        link.next = root
        root.prev = link
        return link.value

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek[D](self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """Value of ``key`` without touching recency."""
        link = self._map.get(key)
        return default if link is None else link.value

    def set(self, key: K, value: V) -> tuple[K, V] | None:
        """Store ``value`` as the most recent; evict the least recent if full.

        Returns the evicted ``(key, value)`` or None.
        """
        mapping = self._map
        link = mapping.get(key)
        root = self._root
        if link is not None:
            link.value = value
            prev = link.prev
            nxt = link.next
            prev.next = nxt
            nxt.prev = prev
            last = root.prev
            last.next = link
            link.prev = last
            link.next = root
            root.prev = link
            return None
        evicted: tuple[K, V] | None = None
        if len(mapping) >= self._capacity:
            # Reuse the oldest link for the new entry: no allocation on a full cache.
            link = root.next
            evicted = (link.key, link.value)
            del mapping[link.key]
            nxt = link.next
            root.next = nxt
            nxt.prev = root
        else:
            link = _Link()
        link.key = key
        link.value = value
        last = root.prev
        last.next = link
        link.prev = last
        link.next = root
        root.prev = link
        mapping[key] = link
        return evicted

    __setitem__ = set

    @overload
    def pop(self, key: K) -> V | None: ...
    @overload
    def pop[D](self, key: K, default: D) -> V | D: ...
    def pop(self, key: K, default: object = None) -> object:
        """Remove ``key`` and return its value (or ``default``)."""
        link = self._map.pop(key, None)
        if link is None:
            return default
        prev = link.prev
        nxt = link.next
        prev.next = nxt
        nxt.prev = prev
        return link.value

    def keys(self) -> list[K]:
        """Keys from least to most recent."""
        out: list[K] = []
        root = self._root
        link = root.next
        while link is not root:
            out.append(link.key)
            link = link.next
        return out

    def clear(self) -> None:
        self._map.clear()
        root = self._root
        root.prev = root.next = root


class OrderedDictLRU[K: Hashable, V]:
    """LRU map on ``collections.OrderedDict``."""

    __slots__ = ("_capacity", "_map")

    def __init__(self, capacity: int) -> None:
        _check_capacity(capacity)
        self._capacity = capacity
        self._map: OrderedDict[K, V] = OrderedDict()

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        """Membership without touching recency."""
        return key in self._map

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get[D](self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        """Value of ``key`` (now the most recent) or ``default``."""
        mapping = self._map
        value = mapping.get(key, _MISSING)
        if value is _MISSING:
            return default
        mapping.move_to_end(key)
        return value

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek[D](self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """Value of ``key`` without touching recency."""
        return self._map.get(key, default)

    def set(self, key: K, value: V) -> tuple[K, V] | None:
        """Store ``value`` as the most recent; evict the least recent if full.

        Returns the evicted ``(key, value)`` or None.
        """
        mapping = self._map
        if key in mapping:
            mapping[key] = value
            mapping.move_to_end(key)
            return None
        evicted = mapping.popitem(last=False) if len(mapping) >= self._capacity else None
        mapping[key] = value
        return evicted

    __setitem__ = set

    @overload
    def pop(self, key: K) -> V | None: ...
    @overload
    def pop[D](self, key: K, default: D) -> V | D: ...
    def pop(self, key: K, default: object = None) -> object:
        """Remove ``key`` and return its value (or ``default``)."""
        return self._map.pop(key, default)

    def keys(self) -> list[K]:
        """Keys from least to most recent."""
        return list(self._map)

    def clear(self) -> None:
        self._map.clear()


#: The implementation the runtime uses (measured by bench/core.py).
FastestLRU = OrderedDictLRU


def make_lru(capacity: int) -> FastestLRU[Any, Any]:
    """A new LRU map of the measured-fastest kind.

    Untyped entries, so an unannotated attribute may hold it; annotate the
    attribute (``FastestLRU[K, V]``) for checked keys and values.
    """
    return FastestLRU(capacity)
