"""task_started and task_finished from a worker running in this process: a
connected receiver gets every signal, as Django defines them, whatever the
logging (the test settings keep django.tasks at WARNING, so only the
receivers make the signals needed)."""

import sys
import threading

import pytest
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished, task_started

import shardq
from shardq.backend import ShardqBackend
from tests.helpers import in_process_worker, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker():
    """A worker running in this process, holding all 64 shards."""
    with in_process_worker(concurrency=2) as worker:
        yield worker


class Received:
    """Records every task_started / task_finished: (signal, id, status, exception seen by the receiver)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str, str | None]] = []

    def started(self, sender, task_result, **kwargs):
        self._add("started", sender, task_result)

    def finished(self, sender, task_result, **kwargs):
        self._add("finished", sender, task_result)

    def _add(self, name, sender, task_result):
        assert sender is ShardqBackend
        error = sys.exc_info()[1]  # Django's own receiver logs it as exc_info
        with self.lock:
            self.events.append((name, task_result.id, task_result.status, None if error is None else str(error)))

    def of(self, job_id):
        with self.lock:
            return [event[:1] + event[2:] for event in self.events if event[1] == job_id]


@pytest.fixture
def received():
    received = Received()
    task_started.connect(received.started, weak=False)
    task_finished.connect(received.finished, weak=False)
    yield received
    task_started.disconnect(received.started)
    task_finished.disconnect(received.finished)


def finished(results) -> bool:
    for result in results:
        result.refresh()
    return all(result.is_finished for result in results)


def test_a_connected_receiver_gets_started_and_finished_for_every_job(worker, received):
    ok = shardq.enqueue_many(tasks.add, [((n, 1), {}) for n in range(50)])
    failed = tasks.fail.enqueue("boom")
    wait_until(lambda: finished([*ok, failed]), timeout=60, message="the jobs to finish")
    wait_until(lambda: len(received.of(failed.id)) == 2, timeout=10, message="the failure's task_finished")
    for result in ok:
        assert received.of(result.id) == [
            ("started", TaskResultStatus.RUNNING, None),
            ("finished", TaskResultStatus.SUCCESSFUL, None),
        ]
    # task_finished of a failure is sent inside the exception handler.
    assert received.of(failed.id) == [
        ("started", TaskResultStatus.RUNNING, None),
        ("finished", TaskResultStatus.FAILED, "boom"),
    ]


def test_a_receiver_connected_while_the_worker_runs_gets_the_signals_of_the_jobs_after_it(worker):
    before = tasks.add.enqueue(1, 1)
    wait_until(lambda: finished([before]), timeout=30, message="a job run with no receiver")
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.id, task_result.status))

    task_finished.connect(receiver)
    try:
        after = tasks.add.enqueue(2, 2)
        wait_until(lambda: (after.id, TaskResultStatus.SUCCESSFUL) in seen, timeout=30, message="task_finished")
    finally:
        task_finished.disconnect(receiver)
    assert seen == [(after.id, TaskResultStatus.SUCCESSFUL)]
