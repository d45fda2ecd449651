"""FifoSet against a list model: bound, batch eviction of the oldest tenth."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shardq.core.fifoset import FifoSet

members = st.integers(min_value=0, max_value=60)


class FifoSetMachine(RuleBasedStateMachine):
    @initialize(capacity=st.integers(min_value=1, max_value=40))
    def start(self, capacity):
        self.s = FifoSet(capacity)
        self.capacity = capacity
        self.batch = max(1, int(capacity * 0.1))
        self.model = []

    @rule(member=members)
    def add_evicts_the_oldest_batch_when_full(self, member):
        evicted = self.s.add(member)
        expected = []
        if member not in self.model:
            if len(self.model) >= self.capacity:
                expected = self.model[: self.batch]
                self.model = self.model[self.batch :]
            self.model.append(member)
        assert evicted == expected

    @rule(member=members)
    def discard(self, member):
        self.s.discard(member)
        if member in self.model:
            self.model.remove(member)

    @rule(member=members)
    def contains_agrees(self, member):
        assert (member in self.s) == (member in self.model)

    @invariant()
    def bound_and_order_hold(self):
        assert len(self.s) == len(self.model) <= self.capacity
        assert list(self.s) == self.model


TestFifoSetAgainstModel = FifoSetMachine.TestCase
TestFifoSetAgainstModel.settings = settings(max_examples=60, stateful_step_count=80, deadline=None)


def test_a_full_set_evicts_a_tenth_at_once():
    s = FifoSet(100)
    for i in range(100):
        s.add(i)
    assert s.add(100) == list(range(10))
    assert len(s) == 91
    for i in range(101, 110):
        assert s.add(i) == []
    assert len(s) == 100


def test_a_re_added_member_keeps_its_place():
    s = FifoSet(3)
    for m in "abc":
        s.add(m)
    s.add("a")
    assert s.add("d") == ["a"]


def test_bad_capacity_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="capacity"):
        FifoSet(0)
