"""A claim that races a takeover: its rows can never be acked, and the new
owner's sweep puts them back (the claim takes no lock on shard rows)."""

import uuid

import pytest

import shardq
from shardq.db.store import WorkerStore
from shardq.worker.jobs import Outcome
from tests.helpers import leased_shard_factory, sql
from tests.taskapp import tasks


@pytest.mark.django_db(transaction=True)
def test_a_late_claim_under_a_superseded_version_is_never_acked_and_is_swept_back():
    from shardq.db.store import ensure_shards

    ensure_shards()
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    store_a, store_b = WorkerStore(), WorkerStore()
    try:
        for worker in (a, b):
            store_a.register_worker(worker, "test", 1, [])
        [result] = shardq.enqueue_many(tasks.ledger, [((), {"n": 7})])  # max_attempts=5
        shard = sql("SELECT shard FROM shardq_job WHERE id = %s", [int(result.id)])[0][0]
        _, versions = leased_shard_factory([shard], worker=a, lease_seconds=30)
        old_version = versions[shard]
        # A's lease expires and B takes the shard over (a new version, from the sequence) ...
        sql("UPDATE shardq_shard SET lease_expires = clock_timestamp() - interval '1 second' WHERE shard = %s", [shard])
        taken = {row["shard"]: row["claim_version"] for row in store_b.claim_shards(b, 64, 30.0, 64, 3)}
        new_version = taken[shard]
        assert new_version > old_version
        # ... while A's claim, begun before the takeover, commits after it:
        # the row is CLAIMED under the superseded version.
        sql(
            "UPDATE shardq_job SET status = 'CLAIMED', fence = %s, status_rank = status_rank + 1 WHERE id = %s",
            [old_version, int(result.id)],
        )
        rank = sql("SELECT status_rank FROM shardq_job WHERE id = %s", [int(result.id)])[0][0]
        late_ack = Outcome(int(result.id), old_version, rank + 1, "SUCCESSFUL", return_value_json="7", shard=shard)
        assert store_a.complete_jobs([late_ack]) == (set(), [])
        [rescued] = store_b.rescue_jobs({shard: new_version}, 3)
        assert (rescued["id"], rescued["started"], rescued["dead"]) == (int(result.id), False, False)
        status, fence, attempts, losses = sql(
            "SELECT status, fence, attempts, worker_losses FROM shardq_job WHERE id = %s", [int(result.id)]
        )[0]
        # Never started: back to READY with nothing charged.
        assert (status, fence, attempts, losses) == ("READY", new_version, 0, 0)
        assert store_b.rescue_jobs({shard: new_version}, 3) == []
    finally:
        store_a.close()
        store_b.close()
