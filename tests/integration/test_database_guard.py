"""The worker's circuit breaker around database calls (shardq.db.store.DatabaseGuard)."""

import pytest

from shardq.db.store import DatabaseGuard, WorkerStore
from shardq.exceptions import DatabaseUnavailable


class ManualClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_three_connection_failures_open_the_circuit_and_calls_fail_fast_with_database_unavailable():
    clock = ManualClock()
    guard = DatabaseGuard(clock=clock)
    for _ in range(3):
        guard.admit("claim_jobs")
        guard.failed()
    with pytest.raises(DatabaseUnavailable, match=r"database unavailable \(circuit open; next probe in 0\.5s\)"):
        guard.admit("claim_jobs")
    clock.now += 0.6
    guard.admit("claim_jobs")  # the half-open probe goes out
    guard.succeeded()
    assert guard.state == "closed"
    guard.admit("claim_jobs")


def test_a_failed_probe_doubles_the_backoff():
    clock = ManualClock()
    guard = DatabaseGuard(clock=clock)
    for _ in range(3):
        guard.admit("x")
        guard.failed()
    clock.now += 0.6
    guard.admit("x")
    guard.failed()
    with pytest.raises(DatabaseUnavailable, match=r"next probe in 1\.0s"):
        guard.admit("x")


@pytest.mark.django_db(transaction=True)
def test_a_worker_store_on_a_live_database_keeps_the_circuit_closed():
    store = WorkerStore(guard=DatabaseGuard())
    try:
        assert store.heartbeat("00000000-0000-0000-0000-000000000001", {}, 30.0) == []
        assert store.guard.state == "closed"
    finally:
        store.close()
