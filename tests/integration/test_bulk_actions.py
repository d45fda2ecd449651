"""Bulk actions on every job matching a filter (shardq/bulk.py,
``manage.py shardq_jobs``): batches by keyset over id, each its own
transaction, each job's status checked again as it is written; nothing lost
or doubled while a worker drains what the retry puts back."""

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import shardq
from shardq import bulk
from shardq.models import Job
from tests.helpers import in_process_worker, scalar, sql, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def dead_letters(task, n, **kwargs):
    """``n`` jobs of ``task`` dead-lettered as a worker leaves them (FAILED, attempts used up)."""
    ids = [int(r.id) for r in shardq.enqueue_many(task, [((), kwargs) for _ in range(n)])]
    sql(
        "UPDATE shardq_job SET status = 'FAILED', attempts = max_attempts, status_rank = status_rank + 2, "
        'finished_at = clock_timestamp(), errors = \'[{"exception_class_path": "builtins.ValueError", '
        '"traceback": "ValueError: no"}]\' WHERE id = ANY(%s)',
        [ids],
    )
    return ids


def statuses(ids) -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM shardq_job WHERE id = ANY(%s) GROUP BY status", [list(ids)]))


def test_retry_by_task_walks_every_batch_and_leaves_other_jobs_alone():
    mine = dead_letters(tasks.noop, 23)
    other = dead_letters(tasks.stamp, 4)
    done = [int(r.id) for r in shardq.enqueue_many(tasks.noop, [((), {})] * 3)]
    sql("UPDATE shardq_job SET status = 'SUCCESSFUL', finished_at = clock_timestamp() WHERE id = ANY(%s)", [done])
    out = io.StringIO()
    call_command("shardq_jobs", "retry", "--task", tasks.noop.module_path, "--batch", "5", "--no-progress", stdout=out)
    assert "23 jobs retried, 0 skipped" in out.getvalue()
    assert statuses(mine) == {"READY": 23}
    assert scalar("SELECT max(attempts) FROM shardq_job WHERE id = ANY(%s)", [mine]) == 0
    assert statuses(other) == {"FAILED": 4}
    assert statuses(done) == {"SUCCESSFUL": 3}
    op = bulk.get(scalar("SELECT max(id) FROM shardq_bulk_operation"))
    assert (op["action"], op["state"], op["total"], op["done"], op["last_id"]) == ("retry", "done", 23, 23, max(mine))
    assert op["filter"] == f"task={tasks.noop.module_path}"


def test_a_job_that_moved_between_the_read_and_the_write_is_skipped_not_touched():
    failed = dead_letters(tasks.noop, 3)
    # One of them was retried (and claimed) by someone else meanwhile.
    sql("UPDATE shardq_job SET status = 'RUNNING', attempts = 1 WHERE id = %s", [failed[1]])
    assert bulk.apply_batch(bulk.ACTIONS["retry"], failed) == 2
    assert dict(sql("SELECT id, status FROM shardq_job WHERE id = ANY(%s)", [failed])) == {
        failed[0]: "READY",
        failed[1]: "RUNNING",
        failed[2]: "READY",
    }
    assert bulk.apply_batch(bulk.ACTIONS["discard"], [failed[1]]) == 0, "discard never deletes a running job"
    assert bulk.apply_batch(bulk.ACTIONS["run-now"], [failed[1]]) == 0, "run-now moves only READY jobs"


def test_nothing_is_lost_or_doubled_when_a_retry_runs_while_a_worker_drains():
    ids = dead_letters(tasks.ledger, 400)
    with in_process_worker(concurrency=4):
        result = bulk.run(bulk.ACTIONS["retry"], Job.objects.filter(task_path=tasks.ledger.module_path), batch=37)
        assert (result.done, result.skipped) == (400, 0)
        wait_until(lambda: statuses(ids) == {"SUCCESSFUL": 400}, timeout=120, message="every retried job to run")
    # Each ran exactly once after the retry: one ledger row each, attempt 1.
    rows = sql("SELECT job_id, count(*), max(attempt) FROM taskapp_ledger WHERE job_id = ANY(%s) GROUP BY 1", [ids])
    assert len(rows) == 400
    assert {(count, attempt) for _, count, attempt in rows} == {(1, 1)}


def test_cancel_run_now_and_discard_each_act_only_on_their_statuses():
    ready = [int(r.id) for r in shardq.enqueue_many(tasks.noop, [((), {})] * 4)]
    deferred = [
        int(r.id)
        for r in shardq.enqueue_many(tasks.stamp.using(run_after=timezone.now() + timedelta(hours=1)), [((), {})] * 3)
    ]
    failed = dead_letters(tasks.noop, 2)
    out = io.StringIO()
    call_command("shardq_jobs", "run-now", "--no-progress", stdout=out)
    assert "3 jobs made due now" in out.getvalue()
    assert scalar("SELECT bool_and(run_after <= clock_timestamp()) FROM shardq_job WHERE id = ANY(%s)", [deferred])
    call_command("shardq_jobs", "cancel", "--task", tasks.noop.module_path, "--no-progress", stdout=out)
    assert "4 jobs cancelled" in out.getvalue()
    assert statuses(ready) == {"FAILED": 4}
    assert (
        scalar(
            "SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND errors -> -1 ->> 'exception_class_path' "
            "= 'shardq.exceptions.Cancelled'",
            [ready],
        )
        == 4
    )
    dry = io.StringIO()
    call_command("shardq_jobs", "discard", "--dead-letter", "--dry-run", stdout=dry)
    assert "2 jobs would be discarded" in dry.getvalue()
    assert statuses(failed) == {"FAILED": 2}
    call_command("shardq_jobs", "discard", "--dead-letter", "--no-progress", stdout=out)
    assert statuses(failed) == {}
    assert statuses(ready) == {"FAILED": 4}, "cancelled jobs are not dead letters (attempts left)"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["retry", "--status", "SUCCESSFUL"], "retry acts only on jobs in FAILED"),
        (["retry", "--status", "DONE"], "is not a job status"),
        (["cancel", "--batch", "0"], "--batch must be a whole number from 1 to 100000"),
        (["discard", "--older-than", "soon"], "--older-than must be a number"),
    ],
)
def test_the_command_refuses_bad_input_naming_it(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("shardq_jobs", *argv, stdout=io.StringIO())
