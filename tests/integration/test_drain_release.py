"""A shard being released after a drain is out of every claim until it has
left ``held`` (the rolling-restart race: rescued == 1 with nothing run twice).

The leaser used to clear ``draining`` before the release's round trip, which
put the shard back in ``fetchable()``: a claim in that window took jobs of a
shard that was then released with them CLAIMED, and the next owner's
takeover rescued them. Here the claim runs in exactly that window: inside
the release statement, before it commits.
"""

import os

import shardq
from shardq.db.store import ensure_shards
from shardq.worker.runtime import Worker, WorkerOptions
from tests.helpers import sql
from tests.taskapp import tasks


def test_a_claim_during_a_drain_release_takes_no_job_of_that_shard(transactional_db):
    ensure_shards()
    worker = Worker(WorkerOptions(concurrency=2))
    worker.store["leaser"].register_worker(worker.id, "test", os.getpid(), [])
    worker.leaser.tick()
    assert len(worker.leaser.held) == 64
    worker.completer.start()
    worker.handback.start()
    try:
        shardq.enqueue_many(tasks.add, [((i, i), {}) for i in range(200)])
        shard = sql("SELECT shard FROM shardq_job GROUP BY shard ORDER BY count(*) DESC LIMIT 1")[0][0]
        real_release = worker.leaser.store.release_shards
        seen = {}

        def claim_then_release(worker_id, pairs, pool, *channel):
            seen["fetchable"] = shard in worker.leaser.fetchable()
            worker.fetcher.fetch_once()  # a claim in the release's round trip
            return real_release(worker_id, pairs, pool, *channel)

        worker.leaser.store.release_shards = claim_then_release
        worker.leaser.start_draining(shard)
        worker.leaser._finish_draining()
        assert seen == {"fetchable": False}
        assert shard not in worker.leaser.held and not worker.leaser.draining
        assert sql("SELECT owner FROM shardq_shard WHERE shard = %s", [shard]) == [(None,)]
        # Nothing of the released shard is claimed, here or in the table.
        assert worker.buffer.drop_shard(shard) == []
        assert sql("SELECT count(*) FROM shardq_job WHERE shard = %s AND status <> 'READY'", [shard]) == [(0,)]
        assert sql("SELECT count(*) FROM shardq_job WHERE status = 'CLAIMED'")[0][0] > 0, "other shards were claimed"
    finally:
        worker.completer.stop(deadline=0)
        worker.handback.stop(deadline=0)
        for store in worker.store.values():
            store.close()
