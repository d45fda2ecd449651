"""A shard dropped while a claim is in flight (the leaser's ownership lock).

The claim is the real statement on the real database; the only change is a
pause after it returns, standing for an answer still on its way while the
leaser decides to drop a shard whose jobs that claim has just marked CLAIMED.
"""

import os
import threading

import pytest

import shardq
from shardq.db.store import ensure_shards
from shardq.worker.runtime import Worker, WorkerOptions
from tests.helpers import sql, wait_until
from tests.taskapp import tasks


@pytest.fixture
def paused_claim():
    """A worker holding every shard, its completer running, and a fetcher
    whose next claim commits and then waits for ``proceed``."""
    ensure_shards()
    worker = Worker(WorkerOptions(concurrency=2))
    worker.store["leaser"].register_worker(worker.id, "test", os.getpid(), [])
    worker.leaser.tick()
    assert len(worker.leaser.held) == 64
    worker.completer.start()
    worker.handback.start()
    real_claim = worker.fetcher.store.claim_jobs
    committed, proceed = threading.Event(), threading.Event()

    def claim_then_pause(*args, **kwargs):
        rows = real_claim(*args, **kwargs)
        committed.set()
        proceed.wait(timeout=30)
        return rows

    worker.fetcher.store.claim_jobs = claim_then_pause
    shardq.enqueue_many(tasks.add, [((i, i), {}) for i in range(40)])
    fetch = threading.Thread(target=worker.fetcher.fetch_once)
    fetch.start()
    assert committed.wait(timeout=30), "the claim to commit"
    shard = sql("SELECT shard FROM shardq_job WHERE status = 'CLAIMED' GROUP BY shard ORDER BY count(*) DESC LIMIT 1")[
        0
    ][0]
    try:
        yield worker, shard, proceed, fetch
    finally:
        proceed.set()
        fetch.join(timeout=30)
        worker.completer.stop(deadline=0)
        worker.handback.stop(deadline=0)
        for store in worker.store.values():
            store.close()


def returned_unrun(shard) -> bool:
    """Every job of ``shard`` is READY again with no attempt counted."""
    return sql("SELECT DISTINCT status, attempts FROM shardq_job WHERE shard = %s", [shard]) == [("READY", 0)]


@pytest.mark.django_db(transaction=True)
def test_a_drain_waits_for_the_claim_in_flight_and_then_hands_back_its_jobs(paused_claim):
    worker, shard, proceed, fetch = paused_claim
    drain = threading.Thread(target=worker.leaser.start_draining, args=(shard,))
    drain.start()
    wait_until(lambda: worker.leaser.ownership.waiting == (0, 1), timeout=10, message="the drain to wait for the claim")
    assert not worker.leaser.draining
    proceed.set()
    fetch.join(timeout=30)
    drain.join(timeout=30)
    assert worker.leaser.draining == {shard}
    # The claim's jobs of that shard reached the buffer before the drop, so
    # the drop found them: none is left to run here after the release.
    assert worker.buffer.drop_shard(shard) == []
    wait_until(lambda: returned_unrun(shard), message="the drained shard's jobs to go back to READY unrun")
    others = sql("SELECT count(*) FROM shardq_job WHERE shard <> %s AND status = 'CLAIMED'", [shard])[0][0]
    assert others == worker.buffer.buffered > 0


@pytest.mark.django_db(transaction=True)
def test_a_self_fence_does_not_wait_past_a_heartbeat_for_a_stuck_claim(paused_claim):
    worker, shard, proceed, fetch = paused_claim
    worker.leaser.heartbeat = 0.2
    worker.leaser._self_fence({shard}, "the test fences it")
    assert fetch.is_alive(), "the self-fence went ahead while the claim was still out"
    assert shard not in worker.leaser.held
    proceed.set()
    fetch.join(timeout=30)
    # The late claim brought jobs of a shard no longer held: handed back, not buffered.
    assert worker.buffer.drop_shard(shard) == []
    wait_until(lambda: returned_unrun(shard), message="the fenced shard's jobs to go back to READY unrun")
    assert worker.buffer.buffered > 0
