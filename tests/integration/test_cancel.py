"""``shardq.cancel``: jobs that have not finished end FAILED with Cancelled."""

import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

import shardq
from tests.helpers import job_row
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_ready_job_is_cancelled_and_says_why():
    result = tasks.add.enqueue(1, 2)
    rank = job_row(result.id)["status_rank"]
    assert shardq.cancel(result, reason="the order was refunded") == [result.id]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "shardq.exceptions.Cancelled"
    assert error.traceback == "shardq.exceptions.Cancelled: cancelled while ready: the order was refunded\n"
    row = job_row(result.id)
    assert row["status_rank"] == rank + 1 and row["finished_at"] is not None


def test_a_running_job_is_cancelled_and_its_attempt_can_no_longer_write():
    result = tasks.add.enqueue(1, 2)
    with connection.cursor() as cursor:  # as a claim leaves it
        cursor.execute(
            "UPDATE shardq_job SET status = 'RUNNING', status_rank = 1, attempts = 1 WHERE id = %s", [int(result.id)]
        )
    assert shardq.cancel(result.id) == [result.id]
    row = job_row(result.id)
    assert (row["status"], row["status_rank"]) == ("FAILED", 2)
    assert row["errors"][-1]["traceback"] == "shardq.exceptions.Cancelled: cancelled while running\n"
    # The running attempt's ack carries rank 2 (its claim's + 1): refused.
    from shardq.db.store import WorkerStore
    from shardq.worker.jobs import Outcome

    store = WorkerStore()
    try:
        assert store.complete_jobs([Outcome(int(result.id), 0, 2, "SUCCESSFUL", return_value_json="3")]) == (set(), [])
    finally:
        store.close()
    assert job_row(result.id)["status"] == "FAILED"


def test_finished_and_unknown_jobs_are_left_as_they_are():
    done = tasks.add.enqueue(1, 2)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE shardq_job SET status = 'SUCCESSFUL' WHERE id = %s", [int(done.id)])
    waiting = tasks.add.enqueue(2, 3)
    assert shardq.cancel(done, waiting, "999999999") == [waiting.id]
    assert job_row(done.id)["status"] == "SUCCESSFUL"
    assert shardq.cancel(waiting) == []  # already cancelled


def test_a_cancel_inside_a_rolled_back_transaction_never_happened():
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert shardq.cancel(result) == [result.id]
        raise RuntimeError("roll back")
    assert job_row(result.id)["status"] == "READY"


def test_a_bad_id_is_refused_with_what_an_id_looks_like():
    with pytest.raises(TaskResultDoesNotExist, match="is not a shardq job id"):
        shardq.cancel("job-7")
    with pytest.raises(TypeError, match="reason must be a str"):
        shardq.cancel("7", reason=7)


def test_cancelling_a_running_job_logs_that_its_outcome_was_dropped_not_a_lost_fence(caplog):
    import logging
    import uuid

    from shardq.db.store import WorkerStore, ensure_shards
    from shardq.worker.completer import Completer
    from shardq.worker.jobs import ClaimedJob, Outcome
    from tests.helpers import pipeline_factory

    ensure_shards()
    worker = str(uuid.uuid4())
    store = WorkerStore(application_name="shardq-test")
    try:
        store.register_worker(worker, "test", 1, [])
        store.claim_shards(worker, 64, 30.0, 64, 3)
        result = tasks.add.enqueue(1, 2)
        [job] = [ClaimedJob.from_row(row) for row in store.claim_jobs(worker, list(range(64)), None, 1, 1)]
        started, _ = store.start_jobs(worker, [job])
        rank = started[job.id]["status_rank"] + 1
        assert shardq.cancel(result) == [result.id]
        config, pipeline = pipeline_factory(store, worker)
        completer = Completer(config, pipeline, store)
        completer.put(Outcome(job.id, job.fence, rank, "SUCCESSFUL", return_value_json="3", shard=job.shard))

        with caplog.at_level(logging.INFO, logger="shardq"):
            completer.flush_once(block=False)
    finally:
        store.close()

    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("shardq")]
    assert ("INFO", f"job {job.id} was cancelled while it ran: the cancelled job's outcome was dropped") in lines
    assert not [message for level, message in lines if level == "WARNING"]
    assert job_row(result.id)["status"] == "FAILED"
