"""The two owners split off the completer, tested through their interfaces
against a real store: ``HandBack`` (claimed jobs that will not run here go
back to READY, counted pending in their shard until written) and
``RememberedOutcomes`` (results kept until their write lands)."""

import pytest

from shardq.db.store import WorkerStore
from shardq.worker.handback import HandBack
from shardq.worker.jobs import ClaimedJob, Outcome
from shardq.worker.remembered import REMEMBERED_RESULT_BYTES, RememberedOutcomes
from shardq.worker.stats import Stats
from tests.helpers import job_factory, leased_shard_factory, sql, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed():
    """Six jobs on shards 0 and 1, claimed (CLAIMED, not started) by a worker holding both."""
    worker, _ = leased_shard_factory([0, 1])
    ids = job_factory(6, shard=lambda i: i % 2)
    store = WorkerStore(application_name="test-handback")
    try:
        jobs = store.claim_jobs(worker, [0, 1], None, 10, 10, row_factory=ClaimedJob)
        assert sorted(job.id for job in jobs) == ids
        yield store, jobs
    finally:
        store.close()


def statuses(ids) -> set[str]:
    return {status for (status,) in sql("SELECT status FROM shardq_job WHERE id = ANY(%s)", [list(ids)])}


def test_hand_backs_are_pending_in_their_shard_until_written_and_then_ready(claimed):
    store, jobs = claimed
    handback = HandBack(store, Stats())
    # Not started yet: queued, counted per shard, nothing written.
    handback.return_jobs(jobs)
    assert handback.pending == 6
    assert handback.pending_in_shard(0) == 3 and handback.pending_in_shard(1) == 3
    assert statuses(job.id for job in jobs) == {"CLAIMED"}
    handback.start()
    try:
        wait_until(lambda: handback.pending == 0, timeout=10, message="the hand-backs to be written")
        assert statuses(job.id for job in jobs) == {"READY"}
        assert handback.stats["returned"] == 6
    finally:
        handback.stop()
    assert handback.failure is None and not handback.alive


def test_a_stop_writes_what_is_still_queued_before_its_deadline(claimed):
    import time

    store, jobs = claimed
    handback = HandBack(store, Stats())
    handback.return_jobs(jobs[:2])  # never started: stop() must still write them
    handback.stop(time.monotonic() + 10)
    assert handback.pending == 0
    assert statuses(job.id for job in jobs[:2]) == {"READY"}
    assert statuses(job.id for job in jobs[2:]) == {"CLAIMED"}


def outcome(job_id: int, status: str = "SUCCESSFUL", value: str = "1") -> Outcome:
    return Outcome(job_id, 1, 1, status, return_value_json=value, shard=0, attempts=1)


def test_remembered_outcomes_keep_small_successes_only_and_forget_what_landed():
    memory = RememberedOutcomes(capacity=100)
    memory.remember(outcome(1))
    memory.remember(outcome(2, value="x" * (REMEMBERED_RESULT_BYTES + 1)))  # too large: runs again
    memory.remember(outcome(3, status="FAILED"))
    memory.remember(outcome(4, status="READY"))
    assert set(memory.recall([1, 2, 3, 4, 5])) == {1}
    memory.forget([1, 99])
    assert memory.recall([1]) == {} and len(memory) == 0


def test_remembered_outcomes_are_bounded_and_forget_the_oldest_first():
    memory = RememberedOutcomes(capacity=64)
    for job_id in range(1, 1001):
        memory.remember(outcome(job_id))
    assert len(memory) <= 64
    assert 1000 in memory.recall([1000]) and memory.recall([1]) == {}
