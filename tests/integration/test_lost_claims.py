"""A claim that committed but whose answer never reached the worker (the
connection died in between) leaves jobs RUNNING under the worker's current
fence; after a failed claim the fetcher finds and hands back such jobs."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import shardq
from shardq.worker.runtime import Worker
from tests.conftest import wait_until
from tests.taskapp import tasks


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else None


@pytest.mark.django_db(transaction=True)
def test_jobs_of_a_claim_whose_answer_was_lost_are_handed_back_and_run():
    from shardq.db.store import ensure_shards

    ensure_shards()
    worker = Worker(concurrency=2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: len(worker.leaser.held) == 64, timeout=30)
        # Due in an hour: the running worker leaves it alone until the test
        # has written the lost claim.
        [result] = shardq.enqueue_many(tasks.add.using(run_after=timezone.now() + timedelta(hours=1)), [((20, 22), {})])
        # As if this worker's claim committed and its answer was lost: CLAIMED
        # under the shard's current version (only its owner claims under it).
        sql(
            "UPDATE shardq_job j SET status = 'CLAIMED', status_rank = status_rank + 1, "
            "fence = s.claim_version, run_after = clock_timestamp() "
            "FROM shardq_shard s WHERE s.shard = j.shard AND j.id = %s AND j.status = 'READY'",
            [int(result.id)],
        )
        assert sql("SELECT status FROM shardq_job WHERE id = %s", [int(result.id)]) == [("CLAIMED",)]
        worker.fetcher.claim_uncertain = True
        worker.fetcher.wake()
        wait_until(
            lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL",
            timeout=30,
            message="the lost claim's job to be handed back and run",
        )
        assert result.return_value == 42
        assert sql("SELECT attempts FROM shardq_job WHERE id = %s", [int(result.id)]) == [(1,)]
    finally:
        worker.request_stop()
        thread.join(timeout=60)


@pytest.mark.django_db(transaction=True)
def test_a_lost_claim_that_started_its_job_has_the_start_taken_back_and_the_job_runs_once():
    from shardq.db.store import ensure_shards

    ensure_shards()
    worker = Worker(concurrency=2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: len(worker.leaser.held) == 64, timeout=30)
        [result] = shardq.enqueue_many(tasks.add.using(run_after=timezone.now() + timedelta(hours=1)), [((1, 2), {})])
        # As if a claim that started this job (claim_jobs' start) committed
        # and its answer was lost: RUNNING, one attempt, this worker's id.
        sql(
            "UPDATE shardq_job j SET status = 'RUNNING', status_rank = status_rank + 1, "
            "fence = s.claim_version, run_after = clock_timestamp(), attempts = 1, "
            "worker_ids = jsonb_build_array(%s::text), started_at = clock_timestamp(), "
            "last_attempted_at = clock_timestamp() "
            "FROM shardq_shard s WHERE s.shard = j.shard AND j.id = %s AND j.status = 'READY'",
            [worker.id, int(result.id)],
        )
        worker.fetcher.claim_uncertain = True
        worker.fetcher.wake()
        wait_until(
            lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL",
            timeout=30,
            message="the lost claim's started job to be handed back and run",
        )
        assert result.return_value == 3
        # The start that never ran was taken back: one attempt, one worker id.
        assert sql(
            "SELECT attempts, jsonb_array_length(worker_ids), worker_losses FROM shardq_job WHERE id = %s",
            [int(result.id)],
        ) == [(1, 1, 0)]
    finally:
        worker.request_stop()
        thread.join(timeout=60)
