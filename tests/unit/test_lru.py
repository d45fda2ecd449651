"""LRU maps (linked list and OrderedDict) against a list-ordered model."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shardq.core.lru import FastestLRU, LinkedLRU, OrderedDictLRU, make_lru

IMPLEMENTATIONS = [LinkedLRU, OrderedDictLRU]
keys = st.integers(min_value=0, max_value=12)


class LRUMachine(RuleBasedStateMachine):
    impl = None

    @initialize(capacity=st.integers(min_value=1, max_value=6))
    def start(self, capacity):
        self.capacity = capacity
        self.lru = self.impl(capacity)
        self.model = []  # [(key, value)] from least to most recent

    def _touch(self, key, value):
        self.model = [kv for kv in self.model if kv[0] != key] + [(key, value)]

    @rule(key=keys, value=st.integers())
    def set_evicts_the_least_recent_when_full(self, key, value):
        evicted = self.lru.set(key, value)
        present = any(k == key for k, _ in self.model)
        expected = None
        if not present and len(self.model) >= self.capacity:
            expected = self.model.pop(0)
        self._touch(key, value)
        assert evicted == expected

    @rule(key=keys)
    def get_refreshes_recency(self, key):
        found = dict(self.model).get(key)
        assert self.lru.get(key) == found
        if found is not None or any(k == key for k, _ in self.model):
            self._touch(key, dict(self.model)[key])

    @rule(key=keys)
    def peek_and_contains_do_not_refresh(self, key):
        assert self.lru.peek(key) == dict(self.model).get(key)
        assert (key in self.lru) == (key in dict(self.model))

    @rule(key=keys)
    def pop_removes(self, key):
        assert self.lru.pop(key, "missing") == dict(self.model).get(key, "missing")
        self.model = [kv for kv in self.model if kv[0] != key]

    @invariant()
    def order_and_bound_agree(self):
        assert len(self.lru) == len(self.model) <= self.capacity
        assert self.lru.keys() == [k for k, _ in self.model]


for _impl in IMPLEMENTATIONS:
    _machine = type(f"{_impl.__name__}Machine", (LRUMachine,), {"impl": _impl})
    _machine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
    globals()[f"Test{_impl.__name__}AgainstModel"] = _machine.TestCase


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_get_saves_a_key_from_the_next_eviction(impl):
    lru = impl(2)
    lru.set("a", 1)
    lru.set("b", 2)
    lru.get("a")
    assert lru.set("c", 3) == ("b", 2)
    assert "a" in lru and "b" not in lru


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_capacity_below_one_is_refused(impl):
    with pytest.raises(ValueError, match="capacity"):
        impl(0)


def test_the_factory_builds_the_measured_fastest_implementation():
    assert isinstance(make_lru(3), FastestLRU)
    assert FastestLRU in IMPLEMENTATIONS
