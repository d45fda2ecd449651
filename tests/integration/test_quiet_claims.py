"""A quiet worker claims only the shards a NOTIFY told of (Fetcher.told_shards).

Once a claim over every held shard found nothing, a NOTIFY's claim walks the
shards it named, not all 64: the pickup's claim is one index probe, not 64
(docs/benchmarks.md, "Pickup latency at 200 jobs/s"). What the narrower claim
must never cost, each shown here on the worker's stages stepped in this
process (tests/helpers.py ``SteppedWorker``), the listener's callback called
as a NOTIFY would:

- a job in a shard nobody told of (a NOTIFY lost, ``NOTIFY`` off, a row an
  operator wrote) is claimed by the next claim over every shard, at the poll
  or sooner when anything but a NOTIFY wakes the fetcher;
- a deferred job told of is claimed on time, not a poll later: the quiet
  ends at its due time (less the look-ahead);
- a change of the held shards or their fences ends the quiet.
"""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

import shardq
from tests.helpers import sql, stepped_worker
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def two_jobs_in_two_shards() -> tuple[tuple[int, int], tuple[int, int]]:
    """Two READY jobs of different shards, (id, shard) each."""
    ids = [int(r.id) for r in shardq.enqueue_many(tasks.noop, [((), {})] * 8)]
    rows = sql("SELECT id, shard FROM shardq_job WHERE id = ANY(%s) ORDER BY id", [ids])
    first = rows[0]
    second = next(row for row in rows if row[1] != first[1])
    others = [row[0] for row in rows if row[0] not in (first[0], second[0])]
    sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [others])
    return (first[0], first[1]), (second[0], second[1])


def quiet(stepped) -> None:
    """Rounds until a claim over every shard found nothing: the fetcher is quiet."""
    fetcher = stepped.worker.fetcher
    for _ in range(5):
        if stepped.claim():
            continue
        if fetcher._quiet is not None:
            return
    raise AssertionError("the fetcher never went quiet on an empty table")


def test_a_notify_claims_only_its_shard_and_the_next_claim_over_every_shard_takes_the_rest():
    with stepped_worker(concurrency=2) as stepped:
        fetcher, stats = stepped.worker.fetcher, stepped.worker.stats
        quiet(stepped)
        (told_id, told_shard), (untold_id, _) = two_jobs_in_two_shards()

        fetcher.jobs_notified_by(f"{told_shard}:0")
        claimed = stepped.claim()
        assert [job.id for job in claimed] == [told_id]
        assert stats["told_claims"] == 1
        assert sql("SELECT status FROM shardq_job WHERE id = %s", [untold_id]) == [("READY",)]

        # Another told round finds the told shard empty; still quiet.
        fetcher.jobs_notified_by(f"{told_shard}:0")
        assert stepped.claim() == []
        assert stats["told_claims"] == 2 and fetcher._quiet is not None

        # Anything but a NOTIFY of new jobs (here: free room) asks for a
        # claim over every shard, which takes the job nobody told of.
        stepped.worker.pipeline.wake_fetch()
        assert [job.id for job in stepped.claim()] == [untold_id]
        assert stats["told_claims"] == 2


def test_the_quiet_ends_at_the_poll_so_a_job_nobody_told_of_waits_at_most_that():
    with stepped_worker(concurrency=2) as stepped:
        fetcher = stepped.worker.fetcher
        quiet(stepped)
        assert 0 < fetcher._quiet_until - time.monotonic() <= fetcher.poll_interval
        (told_id, told_shard), (untold_id, _) = two_jobs_in_two_shards()
        fetcher.jobs_notified_by(f"{told_shard}:0")
        assert [job.id for job in stepped.claim()] == [told_id]

        fetcher._quiet_until = time.monotonic()  # the poll came
        fetcher.jobs_notified_by(f"{told_shard}:0")
        assert [job.id for job in stepped.claim()] == [untold_id]


def test_a_deferred_job_told_of_ends_the_quiet_at_its_due_time():
    with stepped_worker(concurrency=2) as stepped:
        fetcher = stepped.worker.fetcher
        quiet(stepped)
        fetcher._quiet_until = time.monotonic() + 60  # a long poll (the default is 1 s)
        delay = 1.0  # past the claim's look-ahead (0.5 s)
        result = tasks.noop.using(run_after=timezone.now() + timedelta(seconds=delay)).enqueue()
        shard = sql("SELECT shard FROM shardq_job WHERE id = %s", [int(result.id)])[0][0]

        fetcher.jobs_notified_by(f"{shard}:0")
        fetcher._wake.clear()
        sleep = fetcher.fetch_once()
        assert sleep is not None and sleep <= delay - 0.25 + 0.05, (sleep, delay)
        assert fetcher._quiet_until - time.monotonic() <= delay - 0.25 + 0.05


def test_a_change_of_the_held_shards_ends_the_quiet():
    with stepped_worker(concurrency=2) as stepped:
        fetcher, leaser = stepped.worker.fetcher, stepped.worker.leaser
        quiet(stepped)
        (told_id, told_shard), (untold_id, untold_shard) = two_jobs_in_two_shards()
        assert fetcher._quiet == leaser.fetchable()
        # One held shard starts draining (the leaser's drain, or a peer's
        # rebalance): the shards claimable are not the quiet's any more.
        other = next(shard for shard in leaser.held if shard not in (told_shard, untold_shard))
        leaser.draining.add(other)
        try:
            fetcher.jobs_notified_by(f"{told_shard}:0")
            assert sorted(job.id for job in stepped.claim()) == sorted([told_id, untold_id])
            assert stepped.worker.stats["told_claims"] == 0
        finally:
            leaser.draining.discard(other)
