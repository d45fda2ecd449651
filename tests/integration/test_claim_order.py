"""A claim takes the highest priorities first across the shards it walks
(``claim_jobs``: a probe of each shard's best due priority, then level by
level), so a job it leaves in the table never outranks a job it takes."""

import random

import pytest

from shardq.db.store import WorkerStore
from tests.helpers import job_factory, leased_shard_factory, sql

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 8


def add_jobs(jobs: list[tuple[int, int]]) -> None:
    """READY no-op jobs, one per (shard, priority), enqueued in list order."""
    job_factory(len(jobs), shard=lambda i: jobs[i][0], priority=lambda i: jobs[i][1])


@pytest.fixture
def worker():
    """Shards 0..7 held by a fresh worker id; its store; jobs deleted afterwards."""
    worker, _ = leased_shard_factory(range(SHARDS))
    store = WorkerStore(application_name="test-claim-order")
    yield worker, store
    store.close()
    sql("DELETE FROM shardq_job WHERE shard < %s", [SHARDS])


def ready_priorities() -> list[int]:
    return [p for (p,) in sql("SELECT priority FROM shardq_job WHERE status = 'READY' AND shard < %s", [SHARDS])]


def test_no_claim_leaves_a_job_that_outranks_one_it_takes(worker):
    worker_id, store = worker
    rng = random.Random(7)
    add_jobs([(rng.randrange(SHARDS), rng.choice([-3, 0, 0, 4, 9, 50])) for _ in range(400)])
    claims = 0
    while ready_priorities():
        rows = store.claim_jobs(worker_id, list(range(SHARDS)), None, 3, 20)
        assert rows, "a claim found nothing while jobs were READY"
        left = ready_priorities()
        if left:
            assert min(row["priority"] for row in rows) >= max(left), claims
        claims += 1
    # Level by level costs more claims than the 20-job batches alone would.
    assert claims >= 400 // 20


def test_a_shard_that_leads_alone_fills_the_batch_down_to_the_next_shards_level(worker):
    worker_id, store = worker
    add_jobs([(0, 9), (0, 7), (0, 5), (0, 5), (0, 1), (1, 5), (1, 5), (2, 3)])
    rows = store.claim_jobs(worker_id, list(range(SHARDS)), None, 1, 10)
    # Shard 0's 9 and 7 outrank everything elsewhere; at level 5 each shard
    # gives :per_shard (shard 0 leads, so its walk is not cut at one).
    by_shard = sorted((row["shard"], row["priority"]) for row in rows)
    assert by_shard == [(0, 5), (0, 5), (0, 7), (0, 9), (1, 5)]
    assert sorted(ready_priorities()) == [1, 3, 5]


def test_a_claim_with_a_minimum_priority_leaves_the_jobs_below_it(worker):
    worker_id, store = worker
    add_jobs([(0, 0), (1, 0), (2, 20), (3, 50), (3, 0)])
    rows = store.claim_jobs(worker_id, list(range(SHARDS)), None, 5, 5, min_priority=20)
    assert sorted(row["priority"] for row in rows) == [20, 50]
    assert sorted(ready_priorities()) == [0, 0, 0]
    assert store.claim_jobs(worker_id, list(range(SHARDS)), None, 5, 5, min_priority=21) == []
