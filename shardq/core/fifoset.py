"""A bounded set that forgets its oldest members in batches.

The worker remembers the ids of jobs it completed recently, so a job that
comes back (a redelivery after a lease takeover, a duplicate NOTIFY) can be
recognised cheaply. Exact recency does not matter — insertion order does —
and the set must never grow without bound.

When an ``add`` finds the set full, the oldest 10% (at least one) are evicted
in one batch: eviction runs once per ``capacity/10`` inserts instead of on
every insert. Built on a plain dict (insertion ordered), whose C iteration
finds the oldest members. Not thread-safe: the owner locks.
"""

from collections.abc import Hashable, Iterator
from itertools import islice

__all__ = ["FifoSet"]


class FifoSet[T: Hashable]:
    """Insertion-ordered set of at most ``capacity`` members."""

    __slots__ = ("_batch", "_capacity", "_members")

    def __init__(self, capacity: int, evict_fraction: float = 0.10) -> None:
        if capacity < 1:
            raise ValueError(f"FifoSet capacity must be at least 1, got {capacity!r}")
        if not 0.0 < evict_fraction <= 1.0:
            raise ValueError(f"evict_fraction must be in (0, 1], got {evict_fraction!r}")
        self._capacity = capacity
        self._members: dict[T, None] = {}
        self._batch = max(1, int(capacity * evict_fraction))

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def batch(self) -> int:
        """How many of the oldest members one eviction removes."""
        return self._batch

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def __iter__(self) -> Iterator[T]:
        """Members from oldest to newest."""
        return iter(list(self._members))

    def add(self, member: T) -> list[T]:
        """Add ``member`` (a re-add keeps its original position).

        Returns the members evicted to make room (oldest first), usually [].
        """
        members = self._members
        if member in members:
            return []
        evicted: list[T] = []
        if len(members) >= self._capacity:
            evicted = list(islice(members, self._batch))
            for old in evicted:
                del members[old]
        members[member] = None
        return evicted

    def discard(self, member: T) -> None:
        """Remove ``member`` if present."""
        self._members.pop(member, None)

    def clear(self) -> None:
        self._members.clear()
