"""Lease and due-time statements read ``now`` (``{{now}}`` in shardq/db/sql/:
the given time, else the database's clock): a test jumps past a lease's end
or a job's run_after instead of waiting for it, or faking the rows."""

import uuid
from datetime import timedelta

import pytest

from shardq.db.store import WorkerStore, ensure_shards
from tests.helpers import job_factory, leased_shard_factory, scalar, sql

SHARDS = 64
TTL = 30.0


@pytest.fixture
def stores():
    opened: list[WorkerStore] = []

    def store() -> WorkerStore:
        opened.append(WorkerStore(application_name="test-injected-now"))
        return opened[-1]

    yield store
    for each in opened:
        each.close()


@pytest.mark.django_db(transaction=True)
def test_a_lease_past_its_end_is_taken_over_and_its_claims_rescued_without_waiting_for_it(stores):
    ensure_shards()
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    store_a, store_b = stores(), stores()
    for worker in (a, b):
        store_a.register_worker(worker, "test", 1, [])
    _, versions = leased_shard_factory(range(SHARDS), worker=a, lease_seconds=TTL)
    [job] = job_factory(1, shard=0)
    sql("UPDATE shardq_job SET status = 'CLAIMED', fence = %s, status_rank = 1 WHERE id = %s", [versions[0], job])
    later = scalar("SELECT clock_timestamp()") + timedelta(seconds=TTL + 1)

    # Now, A's leases hold: nothing for B, and A is a live member of the pool.
    assert store_b.claim_shards(b, SHARDS, TTL, SHARDS, 3) == []
    assert set(store_b.heartbeat(b, {}, TTL)) == {a, b}
    # One TTL on, with no heartbeat from A: B alone is live, and takes A's shards over.
    assert store_b.heartbeat(b, {}, TTL, now=later) == [b]
    taken = store_b.claim_shards(b, SHARDS, TTL, SHARDS, 3, now=later)
    assert sorted(row["shard"] for row in taken) == list(range(SHARDS))
    assert {row["previous_owner"] for row in taken} == {uuid.UUID(a)}
    assert {row["shard"]: row["rescued"] for row in taken if row["rescued"]} == {0: 1}
    # The claim was never started: READY again under B's version, nothing charged.
    assert sql("SELECT status, attempts, worker_losses FROM shardq_job WHERE id = %s", [job]) == [("READY", 0, 0)]
    # B's leases run from the time it was given, and A can renew none of its own.
    expires = scalar("SELECT min(lease_expires) FROM shardq_shard WHERE owner = %s", [b])
    assert expires == later + timedelta(seconds=TTL)
    assert store_a.renew_leases(a, versions, TTL, now=later) == set()


@pytest.mark.django_db(transaction=True)
def test_a_delayed_job_is_claimed_and_started_once_the_clock_reaches_its_run_after(stores):
    store = stores()
    worker, _ = leased_shard_factory([0], lease_seconds=7200)
    [job] = job_factory(1, shard=0, delay=3600)
    run_after = scalar("SELECT run_after FROM shardq_job WHERE id = %s", [job])

    def claim(**options):
        return store.claim_jobs(worker, [0], None, per_shard=10, limit=10, **options)

    # Not due for an hour: nothing to claim, and the fetcher would sleep until then.
    assert claim() == []
    assert 3590 < store.seconds_until_due([0]) <= 3600
    assert store.seconds_until_due([0], now=run_after - timedelta(seconds=2)) == pytest.approx(2.0)
    # Within the look-ahead it is claimed early (its thread waits for its run_after).
    [early] = claim(lookahead=5.0, now=run_after - timedelta(seconds=2))
    assert (early["id"], early["started"]) == (job, False)
    sql("UPDATE shardq_job SET status = 'READY' WHERE id = %s", [job])
    # At its run_after it is due: claimed without a look-ahead (a claim starts nothing).
    [due] = claim(now=run_after)
    assert (due["id"], due["started"]) == (job, False)
    assert store.seconds_until_due([0], now=run_after) is None
