"""Delayed-job indexes (skip list and SortedList) against a sorted-list model."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from shardq.core.skiplist import (
    SKIPLIST_MAX_ENTRIES,
    SkipListDelayedIndex,
    SortedListDelayedIndex,
    make_delayed_index,
)

IMPLEMENTATIONS = [SkipListDelayedIndex, SortedListDelayedIndex]
times = st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0, 10.0])


class DelayedIndexMachine(RuleBasedStateMachine):
    impl = None
    ids = Bundle("ids")

    def __init__(self):
        super().__init__()
        self.index = self.impl(seed=0)
        self.model = []  # sorted list of (time, order, id)
        self.order = 0
        self.next_id = 0

    def _model_add(self, item_id, time):
        self.model = [e for e in self.model if e[2] != item_id]
        self.model.append((time, self.order, item_id))
        self.model.sort()
        self.order += 1

    @rule(target=ids, time=times)
    def add(self, time):
        item_id = self.next_id
        self.next_id += 1
        self.index.add(item_id, time, f"job{item_id}")
        self._model_add(item_id, time)
        return item_id

    @rule(item_id=ids, time=times)
    def add_again_moves(self, item_id, time):
        self.index.add(item_id, time, f"job{item_id}")
        self._model_add(item_id, time)

    @rule(item_id=ids)
    def remove(self, item_id):
        present = any(e[2] == item_id for e in self.model)
        assert self.index.remove(item_id) is present
        self.model = [e for e in self.model if e[2] != item_id]

    @rule(now=st.sampled_from([-1.0, 0.0, 1.0, 1.7, 2.0, 5.0, 11.0]))
    def pop_due_takes_exactly_the_due_prefix(self, now):
        due = [f"job{e[2]}" for e in self.model if e[0] <= now]
        self.model = [e for e in self.model if e[0] > now]
        assert self.index.pop_due(now) == due

    @invariant()
    def contents_agree(self):
        assert len(self.index) == len(self.model)
        assert self.index.items() == [f"job{e[2]}" for e in self.model]
        expected_next = self.model[0][0] if self.model else None
        assert self.index.next_time() == expected_next


for _impl in IMPLEMENTATIONS:
    _machine = type(f"{_impl.__name__}Machine", (DelayedIndexMachine,), {"impl": _impl})
    _machine.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
    globals()[f"Test{_impl.__name__}AgainstModel"] = _machine.TestCase


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_pop_due_returns_equal_times_in_insertion_order(impl):
    index = impl()
    for i in range(5):
        index.add(i, 1.0, i)
    index.add(99, 0.5, 99)
    assert index.pop_due(1.0) == [99, 0, 1, 2, 3, 4]
    assert not index and index.next_time() is None


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_pop_due_before_the_first_time_returns_nothing(impl):
    index = impl()
    index.add(1, 5.0, "a")
    assert index.pop_due(4.999) == []
    assert 1 in index


def test_skip_list_handles_many_entries_and_removes_by_id():
    index = SkipListDelayedIndex(seed=1)
    for i in range(2000):
        index.add(i, float((i * 7919) % 1000), i)
    for i in range(0, 2000, 3):
        assert index.remove(i)
    due = index.pop_due(499.0)
    assert all((i * 7919) % 1000 <= 499 and i % 3 for i in due)
    rest = index.items()
    assert sorted(due + rest) == [i for i in range(2000) if i % 3]
    assert [(i * 7919) % 1000 for i in rest] == sorted((i * 7919) % 1000 for i in rest)


def test_the_factory_picks_the_skip_list_for_small_sizes_and_sortedlist_beyond():
    assert isinstance(make_delayed_index(1000), SkipListDelayedIndex)
    assert isinstance(make_delayed_index(SKIPLIST_MAX_ENTRIES), SkipListDelayedIndex)
    assert isinstance(make_delayed_index(SKIPLIST_MAX_ENTRIES + 1), SortedListDelayedIndex)
    assert isinstance(make_delayed_index(), SortedListDelayedIndex)
