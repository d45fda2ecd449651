"""The harness's own tool: ``shardq.complete_in_transaction`` / ``shardq.fenced``
commit a task's writes and its fenced SUCCESSFUL mark together, or neither."""

from types import SimpleNamespace

import pytest
from django.db import transaction

import shardq
from shardq.completion import CommittedByTask
from shardq.db.store import WorkerStore, ensure_shards
from shardq.worker.executor import ShardqTaskContext
from tests.taskapp.models import FaultLedger
from tests.workers import query, scalar

WORKER, OTHER = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"


@pytest.fixture
def claimed(transactional_db):
    """One job claimed by WORKER on shard 0: (store, context)."""
    ensure_shards()
    job_id = scalar(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at) "
        "VALUES ('tests.taskapp.fault_tasks.tx_ledger', 'default', 'default', 0, now(), 0, 0, false, 'READY', 0, 0, "
        "0, 3, '[]', '{}', '[]', '[]', now()) RETURNING id"
    )
    store = WorkerStore(application_name="shardq-test")
    store.claim_shards(WORKER, 1, 30.0, 1, 3)
    (row,) = store.claim_jobs(WORKER, [0], None, 1, 1)
    job = SimpleNamespace(id=row["id"], fence=row["fence"], status_rank=row["status_rank"])
    started, _ = store.start_jobs(WORKER, [job])
    context = ShardqTaskContext(
        task_result=SimpleNamespace(id=str(job_id), worker_ids=[WORKER]),
        fence=row["fence"],
        shard=0,
        rank=started[job_id]["status_rank"] + 1,
        completion_state=CommittedByTask(),
    )
    yield store, context
    store.close()


def job(context):
    return query(
        "SELECT status, status_rank, return_value FROM shardq_job WHERE id = %s", [int(context.task_result.id)]
    )[0]


def test_the_outcome_and_the_tasks_writes_commit_together(claimed):
    _store, context = claimed
    with shardq.fenced(context) as done:
        FaultLedger.objects.create(
            job_id=int(context.task_result.id), attempt=1, fence=context.fence, shard_version=0, worker=WORKER
        )
        done.return_value = {"ok": 1}
    assert done.shard_version == context.fence
    assert job(context) == ("SUCCESSFUL", context.rank, '{"ok": 1}')
    assert FaultLedger.objects.count() == 1
    assert context.completion_state.written is True


def test_an_error_after_the_completion_rolls_both_back(claimed):
    _store, context = claimed
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        shardq.complete_in_transaction(context, return_value=1)
        FaultLedger.objects.create(job_id=1, attempt=1, fence=1, shard_version=1, worker=WORKER)
        1 / 0
    assert job(context)[0] == "RUNNING"
    assert FaultLedger.objects.count() == 0
    assert not context.completion_state.written, "the executor still owns the outcome"


def test_a_taken_over_shard_raises_fence_lost_and_commits_nothing(claimed):
    _store, context = claimed
    query("UPDATE shardq_shard SET lease_expires = clock_timestamp() - interval '1 second' WHERE shard = 0")
    other = WorkerStore(application_name="shardq-test")
    try:
        (taken,) = other.claim_shards(OTHER, 1, 30.0, 1, 3)
    finally:
        other.close()
    assert taken["rescued"] == 1, "the takeover rescued the running job"
    with pytest.raises(shardq.FenceLost, match="no longer current"), transaction.atomic():
        FaultLedger.objects.create(job_id=1, attempt=1, fence=1, shard_version=1, worker=WORKER)
        shardq.complete_in_transaction(context, return_value=1)
    assert job(context)[0] == "READY"
    assert FaultLedger.objects.count() == 0
    assert not context.completion_state.written


def test_a_return_value_that_is_not_json_is_refused_before_any_write(claimed):
    _store, context = claimed
    with pytest.raises(TypeError, match="the return value is not JSON"), transaction.atomic():
        shardq.complete_in_transaction(context, return_value=object())
    assert job(context)[0] == "RUNNING"


def test_a_plain_django_task_context_is_refused_clearly(claimed):
    _store, context = claimed
    with pytest.raises(TypeError, match="needs the ShardqTaskContext"):
        shardq.complete_in_transaction(SimpleNamespace(task_result=context.task_result))
