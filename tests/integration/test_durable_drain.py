"""shardq.testing.drain() runs durable jobs' step and iterate inside the
test's transaction (shardq/testing/durable.py): a step's function runs once
across the retries the drain follows, an iteration resumes after its last
batch, and a suspension is refused clearly."""

from django.tasks import TaskResultStatus
from django.test import TestCase

from shardq.testing import drain
from tests.helpers import job_row
from tests.taskapp import durable_tasks
from tests.taskapp.models import Item, ItemLedger, StepRun


class DrainDurableTests(TestCase):
    def test_a_retried_backfill_resumes_after_its_last_batch_and_its_step_runs_once(self):
        Item.objects.bulk_create(Item(tenant=4, n=i) for i in range(10))
        result = durable_tasks.flaky_backfill.enqueue(tenant=4, size=3, fail_after=2)

        report = drain()

        assert [ran.status for ran in report] == [TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL]
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        # The batch that raised rolled back with its writes and its cursor: the
        # retry walked from the second batch on (3 + 3 + 1 items), none twice.
        assert result.return_value == {"items": 10, "batches_this_run": 3}
        ledger = list(ItemLedger.objects.filter(job_id=int(result.id)).values_list("item_id", flat=True))
        assert sorted(ledger) == sorted(Item.objects.filter(tenant=4).values_list("pk", flat=True))
        assert StepRun.objects.filter(job_id=int(result.id), name="plan").count() == 1

    def test_the_generic_iterate_and_steps_run_in_a_drain(self):
        result = durable_tasks.pages.enqueue(last=8)

        drain()

        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == list(range(8))

    def test_a_sleep_in_a_drain_fails_the_job_saying_to_test_it_with_a_worker(self):
        result = durable_tasks.napper.enqueue(seconds=1.0)

        drain()

        row = job_row(result.id)
        assert row["status"] == "FAILED"
        error = row["errors"][-1]
        assert error["exception_class_path"] == "shardq.testing.durable.DrainCannotSuspend"
        assert "drain() cannot do" in error["traceback"] and "test suspensions with a worker" in error["traceback"]

    def test_a_durable_call_in_an_async_task_fails_the_job_in_a_drain_saying_to_declare_it_with_def(self):
        result = durable_tasks.async_stepper.enqueue()

        drain()

        row = job_row(result.id)
        assert row["status"] == "FAILED"
        error = row["errors"][-1]
        assert error["exception_class_path"] == "shardq.exceptions.DurableNeedsSyncTask"
        assert "Declare the task with `def`" in error["traceback"]
