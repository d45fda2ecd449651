"""Durable long jobs (shardq/durable.py) on an in-process worker: steps recorded
once, iterations whose batches commit exactly once with their cursor,
interruptions that hand the job back without using an attempt, suspensions
that free the thread and wake at their time or on a signal."""

import time
import uuid

import pytest
from django.db import connection
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

import shardq
from shardq.db.store import WorkerStore
from tests.helpers import in_process_worker, job_row, scalar, sql, wait_until
from tests.taskapp import durable_tasks, tasks
from tests.taskapp.models import Item, ItemLedger, StepRun

pytestmark = pytest.mark.django_db(transaction=True)


def status(result) -> str:
    return job_row(result.id)["status"]


def finished(result) -> bool:
    return status(result) in ("SUCCESSFUL", "FAILED")


def steps_ran(result) -> dict[str, int]:
    runs: dict[str, int] = {}
    for name in StepRun.objects.filter(job_id=int(result.id)).values_list("name", flat=True):
        runs[name] = runs.get(name, 0) + 1
    return runs


def cursor_row(result) -> dict:
    [row] = sql(
        "SELECT batches, total, done, output FROM shardq_job_step WHERE job_id = %s AND kind = 'iterate'",
        [int(result.id)],
    )
    return {"batches": row[0], "total": row[1], "done": row[2], "output": row[3]}


def make_items(tenant: int, n: int) -> None:
    Item.objects.bulk_create(Item(tenant=tenant, n=i) for i in range(n))


def ledger_counts(result) -> dict[int, int]:
    counts: dict[int, int] = {}
    for item_id in ItemLedger.objects.filter(job_id=int(result.id)).values_list("item_id", flat=True):
        counts[item_id] = counts.get(item_id, 0) + 1
    return counts


# -- steps ----------------------------------------------------------------------------


def test_steps_before_a_failure_run_once_across_retries():
    result = durable_tasks.three_steps.enqueue(fail_times=2)
    with in_process_worker(concurrency=2):
        wait_until(lambda: finished(result), timeout=60, message="the job to finish")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    # The recorded outputs come back as JSON, the same on every run.
    assert result.return_value == [{"n": 1}, [2], 3]
    assert len(result.errors) == 2 and job_row(result.id)["attempts"] == 3
    assert steps_ran(result) == {"one": 1, "two": 1, "three": 1}


def test_two_steps_of_one_name_in_one_run_are_an_error():
    result = durable_tasks.twice_named.enqueue()
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "shardq.exceptions.DuplicateStep"
    assert "'same' is used twice in one run" in result.errors[-1].traceback
    assert steps_ran(result) == {"same": 1}
