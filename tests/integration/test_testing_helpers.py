"""shardq.testing, as an application's tests use it: drain() runs the jobs a
test enqueued inside the test's own transaction (Django's TestCase, where
nothing commits and no worker could see them), in autocommit
(TransactionTestCase), with captureOnCommitCallbacks; the assertions and
their messages; the pytest fixture, in this run and in a real pytest
subprocess of a project of its own."""

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from shardq.backend import ShardqBackend
from shardq.testing import (
    WORKER_ID,
    DrainLimitExceeded,
    adrain,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
)
from tests.helpers import job_row, scalar
from tests.taskapp import testing_tasks as tasks
from tests.taskapp.models import Ledger

REPO = Path(__file__).resolve().parents[2]


class Signals:
    """task_started / task_finished as a receiver sees them: (signal, job id, status, sender)."""

    def __init__(self):
        self.seen = []

    def started(self, sender, task_result, **kwargs):
        self.seen.append(("started", task_result.id, task_result.status, sender))

    def finished(self, sender, task_result, **kwargs):
        self.seen.append(("finished", task_result.id, task_result.status, sender))

    def __enter__(self):
        task_started.connect(self.started)
        task_finished.connect(self.finished)
        return self

    def __exit__(self, *exc):
        task_started.disconnect(self.started)
        task_finished.disconnect(self.finished)


class DrainInATestCaseTests(TestCase):
    """Django's TestCase: one transaction, rolled back at the end; drain runs in it."""

    def test_drain_runs_a_job_enqueued_in_the_test_and_writes_its_outcome_as_a_worker_does(self):
        result = tasks.add.enqueue(2, 3)

        report = drain()

        result.refresh()
        assert [(ran.id, ran.status, ran.return_value, ran.attempt) for ran in report] == [
            (result.id, "SUCCESSFUL", 5, 1)
        ]
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
        assert result.worker_ids == [WORKER_ID] and result.attempts == 1 and result.errors == []
        assert result.started_at <= result.last_attempted_at <= result.finished_at
        assert tasks.add.get_result(result.id).return_value == 5
        row = job_row(result.id)
        assert (row["status"], row["attempts"], row["status_rank"]) == ("SUCCESSFUL", 1, 2)
        assert report[0].result.return_value == 5
        assert enqueued() == []
        assert drain() == []

    def test_a_task_that_raises_with_the_default_max_attempts_fails_at_its_first_attempt(self):
        result = tasks.fails.enqueue()

        report = drain()

        result.refresh()
        assert [(ran.status, ran.attempt) for ran in report] == [("FAILED", 1)]
        assert report.failed == list(report) and report.succeeded == [] and report.retried == []
        assert isinstance(report[0].exception, ValueError)
        assert result.status == TaskResultStatus.FAILED and result.attempts == 1
        [error] = result.errors
        assert error.exception_class_path == "builtins.ValueError"
        assert "ValueError: the card was declined" in error.traceback
        assert "the card was declined" in str(report)

    def test_a_retried_job_runs_again_until_it_succeeds_each_attempt_recorded(self):
        result = tasks.flaky.enqueue(succeed_on=3)  # max_attempts=3

        report = drain()

        result.refresh()
        assert [(ran.status, ran.attempt) for ran in report] == [("READY", 1), ("READY", 2), ("SUCCESSFUL", 3)]
        assert all(ran.retry_in_seconds > 0 for ran in report.retried)
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
        assert result.attempts == 3 and result.worker_ids == [WORKER_ID] * 3
        assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"] * 2
        assert report.ids == [result.id]

    def test_a_job_out_of_attempts_ends_failed_after_max_attempts(self):
        result = tasks.flaky.enqueue(succeed_on=5)

        report = drain()

        result.refresh()
        assert [ran.status for ran in report] == ["READY", "READY", "FAILED"]
        assert result.status == TaskResultStatus.FAILED and result.attempts == 3 and len(result.errors) == 3

    def test_until_now_leaves_a_retry_waiting_for_its_backoff(self):
        result = tasks.flaky.enqueue(succeed_on=2)

        first = drain(until=timezone.now())

        assert [ran.status for ran in first] == ["READY"]
        [waiting] = enqueued(tasks.flaky)
        assert waiting.id == result.id and waiting.attempts == 1 and waiting.run_after > timezone.now()
        assert drain(until=timezone.now()) == []
        assert [ran.status for ran in drain()] == ["SUCCESSFUL"]

    def test_run_after_in_the_future_runs_in_the_order_jobs_fall_due_after_the_jobs_due_now(self):
        now = timezone.now()
        later = tasks.add.using(run_after=now + timedelta(hours=2), priority=50).enqueue(1, 1)
        due = tasks.add.enqueue(2, 2)
        sooner = tasks.add.using(run_after=now + timedelta(hours=1)).enqueue(3, 3)

        assert drain(until=now + timedelta(seconds=1)).ids == [due.id]
        assert drain().ids == [sooner.id, later.id]

    def test_due_jobs_run_by_priority_then_age(self):
        low = tasks.add.using(priority=-5).enqueue(0, 0)
        first = tasks.add.enqueue(1, 1)
        high = tasks.add.using(priority=20).enqueue(2, 2)
        second = tasks.add.enqueue(3, 3)

        assert drain().ids == [high.id, first.id, second.id, low.id]

    def test_a_workflow_chain_runs_each_child_once_its_parents_finished(self):
        with transaction.atomic():
            charge, pack, close = tasks.order_chain(7).enqueue()
        assert [job.status for job in enqueued()] == ["READY", "WAITING", "WAITING"]

        report = drain()

        assert report.ids == [charge.id, pack.id, close.id]
        pack.refresh()
        close.refresh()
        assert pack.return_value == "packed 7 after charging 700"
        assert close.return_value == {"charge": "SUCCESSFUL", "pack": "SUCCESSFUL"}

    def test_a_failed_parent_cancels_its_child_and_a_run_anyway_child_reads_the_failure(self):
        with transaction.atomic():
            charge, pack, close = tasks.order_chain(8, failing=True).enqueue()

        report = drain()

        # pack never ran: the resolver moved it to FAILED (ParentFailed).
        assert report.ids == [charge.id, close.id]
        pack.refresh()
        close.refresh()
        assert pack.status == TaskResultStatus.FAILED and pack.worker_ids == []
        assert pack.errors[-1].exception_class_path == "shardq.exceptions.ParentFailed"
        assert close.return_value == {"charge": "FAILED", "pack": "FAILED"}

    def test_a_child_is_ready_once_its_parent_finished_and_runs_by_its_priority(self):
        parent = tasks.add.enqueue(1, 1)
        other = tasks.add.enqueue(2, 2)
        child = tasks.report.using(after=[parent], priority=50).enqueue("urgent")

        assert drain().ids == [parent.id, child.id, other.id]

    def test_draining_one_queue_leaves_the_children_it_released_in_others_for_later(self):
        parent = tasks.add.enqueue(1, 2)
        child = tasks.report.using(after=[parent]).enqueue("after the sum")

        assert drain(queue="default").ids == [parent.id]
        [waiting] = enqueued(tasks.report)
        assert waiting.status == "READY"
        assert drain(queue="reports").ids == [child.id]

    def test_an_async_task_runs_on_the_tests_connection(self):
        product = tasks.async_multiply.enqueue(6, 7)
        ledger = tasks.async_ledger.enqueue(job_id=99)

        drain()

        product.refresh()
        ledger.refresh()
        assert product.return_value == 42
        assert Ledger.objects.get(pk=ledger.return_value).job_id == 99  # written inside the test's transaction

    async def test_adrain_drains_from_an_async_test(self):
        result = await tasks.async_multiply.aenqueue(3, 4)

        report = await adrain()

        await result.arefresh()
        assert report.ids == [result.id] and result.return_value == 12

    def test_a_takes_context_task_gets_shardqs_context_of_this_attempt(self):
        result = tasks.whoami.enqueue()

        drain()

        result.refresh()
        seen = result.return_value
        assert seen["id"] == result.id and seen["attempt"] == 1 and seen["worker_ids"] == [WORKER_ID]
        assert seen["status"] == "RUNNING" and seen["cancelled"] is False and isinstance(seen["fence"], int)

    def test_a_fenced_completion_commits_with_the_tasks_own_write(self):
        result = tasks.charge_fenced.enqueue(order_id=5)

        report = drain()

        result.refresh()
        assert [(ran.status, ran.return_value) for ran in report] == [("SUCCESSFUL", {"charged": 5})]
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"charged": 5}
        assert Ledger.objects.filter(job_id=5, worker="fenced").count() == 1

    def test_a_task_that_cancels_its_own_job_leaves_the_cancel_in_place(self):
        result = tasks.cancels_itself.enqueue()

        report = drain()

        result.refresh()
        assert [ran.status for ran in report] == ["FAILED"]
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[-1].exception_class_path == "shardq.exceptions.Cancelled"

    def test_task_started_and_task_finished_are_sent_as_the_worker_sends_them(self):
        ok = tasks.add.enqueue(1, 1)
        retried = tasks.flaky.enqueue(succeed_on=2)
        failed = tasks.fails.enqueue()

        with Signals() as signals:
            drain()

        assert {sender for *_, sender in signals.seen} == {ShardqBackend}
        assert [(name, job, status) for name, job, status, _ in signals.seen] == [
            ("started", ok.id, "RUNNING"),
            ("finished", ok.id, "SUCCESSFUL"),
            ("started", retried.id, "RUNNING"),
            ("finished", retried.id, "READY"),
            ("started", failed.id, "RUNNING"),
            ("finished", failed.id, "FAILED"),
            ("started", retried.id, "RUNNING"),
            ("finished", retried.id, "SUCCESSFUL"),
        ]

    def test_a_task_that_enqueues_itself_for_ever_stops_at_max_jobs_with_a_clear_error(self):
        tasks.forever.enqueue(0)

        with self.assertRaises(DrainLimitExceeded) as caught:
            drain(max_jobs=25)

        message = str(caught.exception)
        assert "max_jobs=25" in message and "tests.taskapp.testing_tasks.forever ×25" in message
        assert "enqueues itself" in message and "Pass max_jobs=" in message
        assert len(caught.exception.report) == 25
        assert [job.args for job in enqueued(tasks.forever)] == [[25]]

    def test_exactly_max_jobs_jobs_drain_without_an_error(self):
        for i in range(5):
            tasks.add.enqueue(i, i)

        assert len(drain(max_jobs=5)) == 5

    def test_jobs_a_task_enqueues_run_in_the_same_drain(self):
        tasks.fan_out.enqueue(3)

        report = drain()

        assert [ran.task_path.rsplit(".", 1)[1] for ran in report] == ["fan_out", "add", "add", "add"]
        assert [ran.return_value for ran in report] == [3, 0, 2, 4]

    def test_drain_takes_a_queue_or_a_task(self):
        summed = tasks.add.enqueue(1, 1)
        reported = tasks.report.enqueue("q3")
        multiplied = tasks.async_multiply.enqueue(2, 2)

        assert drain(queue="reports").ids == [reported.id]
        assert drain(task=tasks.async_multiply).ids == [multiplied.id]
        assert drain(task=["tests.taskapp.testing_tasks.add"]).ids == [summed.id]

    def test_a_tasks_on_commit_callback_runs_when_the_task_ends_as_in_a_worker(self):
        tasks.enqueue_on_commit.enqueue(5)

        report = drain()

        assert [ran.return_value for ran in report] == [None, 105]

    def test_run_on_commit_false_leaves_a_tasks_callbacks_to_the_tests_transaction(self):
        tasks.enqueue_on_commit.enqueue(5)

        with self.captureOnCommitCallbacks() as callbacks:
            report = drain(run_on_commit=False)

        assert len(report) == 1 and len(callbacks) == 1 and enqueued() == []

    def test_jobs_enqueued_on_commit_run_under_capture_on_commit_callbacks(self):
        # A view's usual pattern: enqueue once the request's transaction commits.
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            transaction.on_commit(lambda: tasks.add.enqueue(4, 4))
        assert len(callbacks) == 1
        assert_enqueued(tasks.add, args=[4, 4])

        # A drain inside the capture runs a task's callbacks once, at the
        # task's end, and leaves none for the capture to run again.
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            tasks.enqueue_on_commit.enqueue(1)
            report = drain()
        assert callbacks == []
        assert sorted(ran.return_value for ran in report if ran.return_value) == [8, 101]
        assert enqueued() == []

    def test_a_tasks_writes_before_it_raised_stay_as_they_would_under_a_worker(self):
        result = tasks.write_then_fail.enqueue(job_id=11)

        drain()

        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert Ledger.objects.filter(job_id=11).count() == 1

    def test_a_task_whose_sql_failed_fails_alone_and_the_tests_transaction_goes_on(self):
        broken = tasks.broken_sql.enqueue(job_id=12)
        after = tasks.add.enqueue(1, 2)

        report = drain()

        assert [(ran.id, ran.status) for ran in report] == [(broken.id, "FAILED"), (after.id, "SUCCESSFUL")]
        broken.refresh()
        assert broken.errors[-1].exception_class_path == "django.db.utils.DataError"
        assert "division by zero" in broken.errors[-1].traceback
        # Its write was rolled back with its savepoint; the test's transaction is usable.
        assert not Ledger.objects.filter(job_id=12).exists()
        assert scalar("SELECT 1") == 1

    def test_a_return_value_that_is_not_json_fails_the_job_with_a_message_saying_what_to_return(self):
        result = tasks.not_json.enqueue()

        drain()

        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert "the return value is not JSON" in result.errors[-1].traceback

    def test_raise_errors_raises_the_tasks_exception_once_its_outcome_is_written(self):
        result = tasks.fails.enqueue()
        tasks.add.enqueue(1, 1)

        with self.assertRaisesMessage(ValueError, "the card was declined"):
            drain(raise_errors=True)

        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert len(enqueued(tasks.add)) == 1  # the drain stopped at the error

    def test_bad_arguments_are_refused_with_a_message_naming_them(self):
        for kwargs, message in [
            ({"max_jobs": 0}, "max_jobs must be a positive int, not 0"),
            ({"task": 3}, "task must be a task"),
            ({"queue": [1]}, "queue must be a queue name or a list of them"),
            ({"until": timezone.now().replace(tzinfo=None)}, "until must be a timezone-aware datetime"),
        ]:
            with self.subTest(kwargs=kwargs), self.assertRaisesMessage(ValueError, message):
                drain(**kwargs)


class AssertEnqueuedTests(TestCase):
    def test_assert_enqueued_finds_the_job_by_task_arguments_and_queue(self):
        result = tasks.add.enqueue(1, 2)
        tasks.report.enqueue(name="daily")

        [job] = assert_enqueued(tasks.add, args=(1, 2), kwargs={}, queue="default")

        assert job.id == result.id and job.status == "READY" and job.result.status == TaskResultStatus.READY
        assert assert_enqueued("tests.taskapp.testing_tasks.report", kwargs={"name": "daily"}, queue="reports")
        assert len(assert_enqueued(tasks.add)) == 1
        assert_enqueued(tasks.add, count=1)
        assert_enqueued(tasks.fails, count=0)

    def test_the_failure_says_how_each_enqueued_job_of_the_task_differs(self):
        first = tasks.add.enqueue(1, 3)
        second = tasks.add.using(queue_name="reports").enqueue(1, 2)
        tasks.report.enqueue(name="daily")
        tasks.report.enqueue(name="weekly")

        with pytest.raises(AssertionError) as caught:
            assert_enqueued(tasks.add, args=[1, 2], queue="default")

        assert str(caught.value) == textwrap.dedent(f"""\
            expected an enqueued job (READY or WAITING) of tests.taskapp.testing_tasks.add args=[1, 2] queue='default', found none.
            Enqueued jobs of tests.taskapp.testing_tasks.add (2), and how each differs:
              job {first.id} tests.taskapp.testing_tasks.add queue='default' args=[1, 3] kwargs={{}} (READY)
                  args[1] is 3, expected 2
              job {second.id} tests.taskapp.testing_tasks.add queue='reports' args=[1, 2] kwargs={{}} (READY)
                  queue is 'reports', expected 'default'
            Enqueued jobs of other tasks: tests.taskapp.testing_tasks.report ×2""")

    def test_the_failure_names_each_keyword_argument_that_differs(self):
        tasks.report.enqueue(name="daily")

        with pytest.raises(AssertionError) as caught:
            assert_enqueued(tasks.report, kwargs={"title": "daily"})

        assert "kwargs['name'] is \"daily\", not expected" in str(caught.value)
        assert "kwargs['title'] is missing, expected \"daily\"" in str(caught.value)

    def test_the_failure_says_when_nothing_is_enqueued_and_when_the_job_ran_already(self):
        with pytest.raises(AssertionError) as nothing:
            assert_enqueued(tasks.add)
        assert str(nothing.value).splitlines()[1:] == [
            "No job of tests.taskapp.testing_tasks.add is enqueued.",
            "Nothing is enqueued at all.",
        ]

        result = tasks.add.enqueue(1, 1)
        drain()
        with pytest.raises(AssertionError) as caught:
            assert_enqueued(tasks.add, args=[1, 1])
        assert (
            f"have run or are running already (enqueued() lists only those not run yet; drain() runs them): "
            f"job {result.id} SUCCESSFUL" in str(caught.value)
        )

    def test_a_count_that_differs_lists_the_jobs_found(self):
        one = tasks.add.enqueue(1, 1)
        two = tasks.add.enqueue(1, 1)

        with pytest.raises(AssertionError) as caught:
            assert_enqueued(tasks.add, args=[1, 1], count=3)

        assert str(caught.value).splitlines() == [
            "expected 3 enqueued jobs of tests.taskapp.testing_tasks.add args=[1, 1], found 2:",
            f"  job {one.id} tests.taskapp.testing_tasks.add queue='default' args=[1, 1] kwargs={{}} (READY)",
            f"  job {two.id} tests.taskapp.testing_tasks.add queue='default' args=[1, 1] kwargs={{}} (READY)",
        ]

    def test_assert_not_enqueued_passes_for_other_arguments_and_lists_what_matches(self):
        result = tasks.add.enqueue(1, 2)

        assert_not_enqueued(tasks.add, args=[2, 2])
        assert_not_enqueued(tasks.report)
        with pytest.raises(AssertionError) as caught:
            assert_not_enqueued(tasks.add)

        assert str(caught.value).splitlines() == [
            "expected no enqueued job of tests.taskapp.testing_tasks.add, found 1:",
            f"  job {result.id} tests.taskapp.testing_tasks.add queue='default' args=[1, 2] kwargs={{}} (READY)",
        ]

    def test_enqueued_lists_waiting_workflow_jobs_and_not_the_ones_that_ran(self):
        with transaction.atomic():
            charge, pack, close = tasks.order_chain(3).enqueue()
        assert [(job.id, job.status) for job in enqueued()] == [
            (charge.id, "READY"),
            (pack.id, "WAITING"),
            (close.id, "WAITING"),
        ]
        assert [job.id for job in enqueued(tasks.pack)] == [pack.id]
        assert [job.id for job in enqueued(queue="reports")] == []

        drain(task=tasks.charge)

        assert [(job.id, job.status) for job in enqueued()] == [(pack.id, "READY"), (close.id, "WAITING")]

    def test_arguments_that_are_not_json_are_refused_with_a_message(self):
        with pytest.raises(TypeError, match="args must be JSON"):
            assert_enqueued(tasks.add, args=[object()])
        with pytest.raises(TypeError, match="args must be a list or tuple"):
            assert_enqueued(tasks.add, args="1, 2")


class DrainInATransactionTestCaseTests(TransactionTestCase):
    """Autocommit: each of drain's writes commits, as a worker's do."""

    def test_drain_commits_outcomes_another_connection_can_read(self):
        from shardq.db.store import connect

        result = tasks.flaky.enqueue(succeed_on=2)
        tasks.write_then_fail.enqueue(job_id=21)

        report = drain()

        assert [ran.status for ran in report] == ["READY", "FAILED", "SUCCESSFUL"]
        with connect() as other:
            status, attempts, value = other.execute(
                "SELECT status, attempts, return_value FROM shardq_job WHERE id = %s", [int(result.id)]
            ).fetchone()
            ledger = other.execute("SELECT count(*) FROM taskapp_ledger WHERE job_id = 21").fetchone()[0]
        assert (status, attempts, value) == ("SUCCESSFUL", 2, 2) and ledger == 1

    def test_a_task_whose_sql_failed_fails_alone_in_autocommit_too(self):
        broken = tasks.broken_sql.enqueue(job_id=22)
        ok = tasks.add.enqueue(1, 1)

        report = drain()

        assert [(ran.id, ran.status) for ran in report] == [(broken.id, "FAILED"), (ok.id, "SUCCESSFUL")]
        assert Ledger.objects.filter(job_id=22).count() == 1  # its first statement had committed
        assert connection.get_autocommit()

    def test_a_fenced_completion_and_a_workflow_drain_in_autocommit(self):
        fenced = tasks.charge_fenced.enqueue(order_id=23)
        with transaction.atomic():
            charge, pack, close = tasks.order_chain(23).enqueue()

        assert drain().ids == [fenced.id, charge.id, pack.id, close.id]
        close.refresh()
        assert close.return_value == {"charge": "SUCCESSFUL", "pack": "SUCCESSFUL"}


# -- the pytest fixture ---------------------------------------------------------


def test_the_fixture_is_registered_by_the_entry_point_and_drains_in_the_tests_transaction(shardq_drain):
    result = tasks.add.enqueue(20, 22)
    shardq_drain.assert_enqueued(tasks.add, args=[20, 22])

    report = shardq_drain()

    result.refresh()
    assert report.ids == [result.id] and result.return_value == 42
    shardq_drain.assert_not_enqueued(tasks.add)
    assert shardq_drain.enqueued() == []
    assert not connection.get_autocommit()  # pytest-django's db: inside the test's transaction


@pytest.mark.django_db(transaction=True)
def test_the_fixture_drains_in_autocommit_under_a_transactional_mark(shardq_drain):
    result = tasks.add.enqueue(1, 2)

    shardq_drain()

    assert connection.get_autocommit()
    assert task_backends["default"].get_result(result.id).return_value == 3


PLUGIN_TESTS = """
import pytest
from django.db import connection

from shardq.testing import WORKER_ID
from tests.taskapp.testing_tasks import add, fails


def test_in_the_tests_transaction(shardq_drain):
    result = add.enqueue(2, 2)
    shardq_drain.assert_enqueued(add, args=[2, 2])
    report = shardq_drain()
    result.refresh()
    assert report.ids == [result.id] and result.return_value == 4 and result.worker_ids == [WORKER_ID]
    assert not connection.get_autocommit()


def test_in_autocommit(transactional_db, shardq_drain):
    failed = fails.enqueue()
    assert [ran.status for ran in shardq_drain()] == ["FAILED"]
    failed.refresh()
    assert failed.status == "FAILED" and connection.get_autocommit()


def test_nothing_is_left_of_the_other_tests(shardq_drain):
    assert shardq_drain.enqueued() == []
"""


def run_pytest(project: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "plugin_settings",
        "PYTEST_ADDOPTS": "",
        **env_vars,
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def plugin_project(tmp_path):
    """A project of its own for a real pytest run: this repository's settings,
    a test database of its own (the outer run's is in use)."""
    name = connection.settings_dict["NAME"]
    (tmp_path / "plugin_settings.py").write_text(
        f"from tests.settings import *  # noqa\nDATABASES['default']['TEST'] = {{'NAME': {(name + '_plugin')!r}}}\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "test_app.py").write_text(PLUGIN_TESTS)
    return tmp_path


@pytest.mark.process
@pytest.mark.timeout(300)
def test_a_real_pytest_run_gets_the_fixture_from_the_entry_point_and_from_pytest_plugins_at_once(plugin_project):
    # Both ways of loading the plugin in one run: no "already registered" error.
    (plugin_project / "conftest.py").write_text('pytest_plugins = ["shardq.testing.pytest_plugin"]\n')

    run = run_pytest(plugin_project)

    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout

    # Without autoloading, pytest_plugins alone brings it; with neither, no fixture.
    (plugin_project / "test_app.py").write_text(PLUGIN_TESTS.split("def test_in_autocommit")[0])
    alone = run_pytest(plugin_project, "-p", "pytest_django.plugin", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    assert alone.returncode == 0 and "1 passed" in alone.stdout, alone.stdout + alone.stderr
    (plugin_project / "conftest.py").unlink()
    blocked = run_pytest(plugin_project, "-p", "no:shardq.testing.pytest_plugin")
    assert blocked.returncode != 0 and "fixture 'shardq_drain' not found" in blocked.stdout


@pytest.mark.process
def test_shardq_testing_needs_no_pytest_and_the_plugin_loads_no_django():
    script = textwrap.dedent("""
        import json, sys
        import shardq.testing.pytest_plugin
        plugin_loaded_django = any(m == "django" or m.startswith("django.") for m in sys.modules)
        del sys.modules["pytest"]
        sys.modules["pytest"] = None  # any import of pytest from here on fails
        import django
        django.setup()
        from shardq.testing import assert_enqueued, drain, enqueued
        print(json.dumps({"plugin_loaded_django": plugin_loaded_django, "drain": drain.__module__}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {
        "plugin_loaded_django": False,
        "drain": "shardq.testing.draining",
    }
