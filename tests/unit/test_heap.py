"""Indexed priority queues (4-ary and heapq) against a sorted-list model."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from shardq.core.heap import (
    FastestIndexedQueue,
    HeapqIndexedQueue,
    QuaternaryIndexedQueue,
    make_indexed_queue,
)

IMPLEMENTATIONS = [QuaternaryIndexedQueue, HeapqIndexedQueue]
# Few distinct values so ties on priority and run_after are common.
priorities = st.sampled_from([-100, -1, 0, 0, 5, 100])
times = st.sampled_from([0.0, 0.5, 1.0, 2.5])


def assert_heap_shape(q):
    heap = q._heap
    arity = 4 if isinstance(q, QuaternaryIndexedQueue) else 2
    for child in range(1, len(heap)):
        assert heap[(child - 1) // arity] <= heap[child]


class IndexedQueueMachine(RuleBasedStateMachine):
    impl = None
    ids = Bundle("ids")

    def __init__(self):
        super().__init__()
        self.q = self.impl()
        self.model = {}  # id -> (neg priority, run_after, order)
        self.order = 0
        self.next_id = 0

    def _model_push(self, item_id, priority, run_after):
        self.model[item_id] = (-priority, run_after, self.order)
        self.order += 1

    @rule(target=ids, priority=priorities, run_after=times)
    def push_new(self, priority, run_after):
        item_id = self.next_id
        self.next_id += 1
        self.q.push(item_id, priority, run_after, ("job", item_id))
        self._model_push(item_id, priority, run_after)
        return item_id

    @rule(item_id=ids, priority=priorities, run_after=times)
    def push_again_replaces(self, item_id, priority, run_after):
        self.q.push(item_id, priority, run_after, ("job", item_id))
        self._model_push(item_id, priority, run_after)

    @rule(item_id=consumes(ids))
    def remove(self, item_id):
        assert self.q.remove(item_id) == (item_id in self.model)
        self.model.pop(item_id, None)

    @precondition(lambda self: self.model)
    @rule()
    def pop_returns_the_model_minimum(self):
        best = min(self.model, key=self.model.__getitem__)
        peeked = self.q.peek()
        assert peeked[3] == best
        assert self.q.pop() == ("job", best)
        del self.model[best]

    @precondition(lambda self: not self.model)
    @rule()
    def pop_on_empty_raises(self):
        assert self.q.peek() is None
        with pytest.raises(IndexError):
            self.q.pop()

    @invariant()
    def sizes_and_membership_agree(self):
        assert len(self.q) == len(self.model)
        assert bool(self.q) == bool(self.model)
        for item_id in self.model:
            assert item_id in self.q

    @invariant()
    def stale_entries_stay_under_twenty_percent(self):
        assert self.q.stale * 5 <= self.q.heap_size
        assert self.q.heap_size - self.q.stale == len(self.model)

    @invariant()
    def heap_property_holds(self):
        assert_heap_shape(self.q)

    def teardown(self):
        expected = [("job", i) for i in sorted(self.model, key=self.model.__getitem__)]
        assert self.q.items() == expected


for _impl in IMPLEMENTATIONS:
    _machine = type(f"{_impl.__name__}Machine", (IndexedQueueMachine,), {"impl": _impl})
    _machine.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
    globals()[f"Test{_impl.__name__}AgainstModel"] = _machine.TestCase


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_pop_orders_by_priority_then_run_after_then_fifo(impl):
    q = impl()
    q.push(1, 0, 5.0, "low-late")
    q.push(2, 0, 1.0, "low-early")
    q.push(3, 10, 9.0, "high")
    q.push(4, 0, 1.0, "low-early-second")
    assert [q.pop() for _ in range(4)] == ["high", "low-early", "low-early-second", "low-late"]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_pop_skips_stale_entries_left_by_remove(impl):
    q = impl()
    for i in range(100):
        q.push(i, 0, float(i), i)
    for i in range(0, 10):
        q.remove(i)
    assert q.stale == 10  # 10% stale: below the compaction threshold
    assert q.pop() == 10
    assert q.stale == 0  # the stale heads were discarded on the way


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_remove_compacts_when_more_than_a_fifth_is_stale(impl):
    q = impl()
    for i in range(100):
        q.push(i, 0, 0.0, i)
    for i in range(20):
        q.remove(i)
    assert q.heap_size == 100 and q.stale == 20
    q.remove(20)  # 21 of 100 stale: rebuild
    assert q.stale == 0 and q.heap_size == 79 == len(q)
    assert q.items() == list(range(21, 100))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_remove_of_an_unknown_id_is_a_no_op(impl):
    q = impl()
    q.push(1, 0, 0.0, "x")
    assert q.remove(2) is False
    assert len(q) == 1 and q.stale == 0


def test_a_shared_counter_keeps_fifo_across_queues():
    from itertools import count

    shared = count()
    a, b = make_indexed_queue(shared), make_indexed_queue(shared)
    a.push(1, 0, 0.0, "first")
    b.push(2, 0, 0.0, "second")
    assert a.peek() < b.peek()


def test_the_factory_builds_the_measured_fastest_implementation():
    assert isinstance(make_indexed_queue(), FastestIndexedQueue)
    assert FastestIndexedQueue in IMPLEMENTATIONS
