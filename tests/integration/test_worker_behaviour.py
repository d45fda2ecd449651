"""One worker's behaviour, in this process (the fast tier): a row naming no
task fails alone, a deferred job starts when due rather than a poll later,
and a cancelled running job's outcome is refused while an operator's retry
runs it again. What needs a real process (signals, kills, the command's
flags, workers sharing shards) stays in tests/acceptance/test_worker.py."""

import datetime

import pytest
from django.utils import timezone

import shardq
from tests.helpers import in_process_worker, scalar, sql, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def drained(count: int) -> bool:
    return scalar("SELECT count(*) FROM shardq_job WHERE status IN ('SUCCESSFUL', 'FAILED')") == count


def test_a_job_naming_a_missing_task_is_dead_lettered_after_the_bound_and_the_worker_keeps_going(settings):
    # Handed back (a deploy may be under way) until UNKNOWN_TASK_TIMEOUT,
    # then dead-lettered naming the path (docs/operations.md); 1 s here.
    settings.SHARDQ = {**settings.SHARDQ, "UNKNOWN_TASK_TIMEOUT": 1}
    with in_process_worker(concurrency=2) as worker:
        good = tasks.add.enqueue(2, 3)
        bad_ids = []
        for path in (
            "tests.taskapp.tasks.deleted_function",
            "tests.taskapp.tasks.NOT_A_TASK",
            "tests.taskapp.tasks.plain_function",
            "os.system",  # run, it would start a process: the tier's guard fails the test
            "no_such_module.task",
        ):
            [(job_id,)] = sql(
                "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, "
                "ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, "
                "enqueued_at) VALUES (%s, 'default', 'default', 0, now(), 3, 3, false, 'READY', 0, 0, 0, 1, "
                "'[\"echo pwned\"]', '{}', '[]', '[]', now()) RETURNING id",
                [path],
            )
            bad_ids.append(job_id)
        wait_until(lambda: drained(6), timeout=60, message="the six jobs to finish")
        assert all(service.failure is None for service in worker.services()), "the worker is still running"
    good.refresh()
    assert good.status == "SUCCESSFUL" and good.return_value == 5
    for job_id in bad_ids:
        [(status, errors)] = sql("SELECT status, errors::text FROM shardq_job WHERE id = %s", [job_id])
        assert status == "FAILED"
        assert "shardq.exceptions.UnknownTask" in errors
    for job_id, path in zip(bad_ids, ("deleted_function", "NOT_A_TASK", "plain_function", "os.system"), strict=False):
        assert path in scalar("SELECT errors::text FROM shardq_job WHERE id = %s", [job_id])


def test_a_deferred_job_starts_when_due_not_a_poll_later(settings):
    settings.SHARDQ = {**settings.SHARDQ, "POLL_INTERVAL": 5.0}
    with in_process_worker(concurrency=2):
        when = timezone.now() + datetime.timedelta(seconds=2)
        result = tasks.add.using(run_after=when).enqueue(1, 1)
        wait_until(lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL", timeout=30)
    started = scalar("SELECT last_attempted_at FROM shardq_job WHERE id = %s", [int(result.id)])
    assert started >= when
    # Claimed ahead of time into the worker's time index: it runs on time
    # even though the next poll is 5 s away and no NOTIFY comes when it is due.
    assert result.finished_at - when < datetime.timedelta(seconds=1.0), result.finished_at - when


def test_cancelling_a_running_job_discards_its_outcome_and_a_retry_runs_it_again():
    from shardq.db.queries import QUERIES

    def executions() -> int:
        return scalar("SELECT count(*) FROM taskapp_ledger WHERE job_id = %s", [int(result.id)])

    with in_process_worker(concurrency=2) as worker:
        result = tasks.ledger_first.enqueue(n=7, sleep=1.5)
        wait_until(lambda: executions() == 1, timeout=30, message="the job to start")
        assert shardq.cancel(result, reason="no longer wanted") == [result.id]
        # The attempt runs to its end; its outcome is refused and counted.
        wait_until(
            lambda: worker.stats["fence_rejections"] == 1,
            timeout=30,
            message=lambda: f"the cancelled job's outcome to be refused; stats {worker.stats.snapshot()}",
        )
        result.refresh()
        assert result.status == "FAILED"
        assert scalar("SELECT return_value FROM shardq_job WHERE id = %s", [int(result.id)]) is None
        assert result.errors[-1].traceback == "shardq.exceptions.Cancelled: cancelled while running: no longer wanted\n"
        # An operator's retry asks for a new run: the worker still remembers
        # the refused result, but does not write it in place of running the
        # task again.
        sql(QUERIES["admin_retry_failed_jobs"], {"ids": [int(result.id)], "notify": True, "channel": "shardq"})
        wait_until(
            lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL", timeout=30, message="the retried job to run"
        )
        assert result.return_value == 7
        assert executions() == 2
        assert worker.stats["recalled"] == 0
