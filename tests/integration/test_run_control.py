"""Run control in a worker running in this process: timeouts (sync threads
and async tasks), the late write, and cooperative cancellation
(``context.is_cancelled()``, ``CancelledError``), by NOTIFY and at the
heartbeat. What needs a process of its own (a thread stuck in C kept as a
zombie, the zombie limit replacing the process) is in
tests/acceptance/test_run_control.py. Task bodies:
tests/taskapp/runctl_tasks.py."""

import json
import time
from pathlib import Path

import pytest

import shardq
from tests.helpers import in_process_worker, scalar, sql, wait_until
from tests.taskapp import runctl_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def marks(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(path: Path) -> list[str]:
    return [m["event"] for m in marks(path)]


def job(result) -> dict:
    row = sql(
        "SELECT status, errors::text, return_value::text, attempts FROM shardq_job WHERE id = %s", [int(result.id)]
    )[0]
    return {"status": row[0], "errors": json.loads(row[1]), "return_value": row[2], "attempts": row[3]}


# Heartbeats 5 s apart: a cancel seen within a second came by NOTIFY.
SLOW_HEARTBEAT = {"HEARTBEAT": 5.0, "LEASE_TTL": 15.0}


@pytest.fixture
def worker(settings):
    """A worker with two threads running in this process, holding every shard."""
    settings.SHARDQ = {**settings.SHARDQ, **SLOW_HEARTBEAT}
    with in_process_worker(concurrency=2) as worker:
        yield worker


def worker_stats(worker) -> dict[str, int]:
    return worker.stats.snapshot()


def finished(result):
    return wait_until(
        lambda: (row := job(result))["status"] in ("FAILED", "SUCCESSFUL") and row,
        timeout=30,
        interval=0.05,
        message=lambda: f"job {result.id} to finish: {job(result)}",
    )


def test_a_pure_python_busy_loop_stops_within_its_timeout_plus_one_second(worker, tmp_path):
    path = tmp_path / "busy"
    result = runctl_tasks.busy_loop.enqueue(str(path))
    row = finished(result)
    wait_until(lambda: "stopped" in events(path), timeout=10, message=lambda: f"the loop to stop: {marks(path)}")
    started, stopped = marks(path)
    assert stopped["at"] - started["at"] <= 1 + 1.0, marks(path)
    assert row["status"] == "FAILED"
    assert row["errors"][-1]["exception_class_path"] == "shardq.exceptions.TaskTimeout"
    assert "ran past its timeout of 1s" in row["errors"][-1]["traceback"]
    wait_until(lambda: worker_stats(worker).get("timeouts") == 1, timeout=10)
    # The thread came back: no zombie, and the worker runs the next job.
    assert not worker_stats(worker).get("zombies")
    after = runctl_tasks.quick.enqueue(str(tmp_path / "quick"), 1)
    assert finished(after)["status"] == "SUCCESSFUL"


def test_a_retry_after_a_timeout_runs(worker, tmp_path):
    path = tmp_path / "retry"
    result = runctl_tasks.slow_then_fast.enqueue(str(path))
    row = wait_until(
        lambda: (r := job(result))["status"] == "SUCCESSFUL" and r,
        timeout=30,
        message=lambda: f"the retry to succeed: {job(result)} {marks(path)}",
    )
    assert row["return_value"] == '"second"'
    assert row["attempts"] == 2
    assert [e["exception_class_path"] for e in row["errors"]] == ["shardq.exceptions.TaskTimeout"]
    assert [m["attempt"] for m in marks(path)] == [1, 2]
    assert worker_stats(worker).get("late_completions_refused", 0) == 0


def test_an_async_task_is_cancelled_at_its_deadline(worker, tmp_path):
    path = tmp_path / "async"
    result = runctl_tasks.async_sleeper.enqueue(str(path))
    row = finished(result)
    wait_until(lambda: "cancelled" in events(path), timeout=10, message=lambda: f"CancelledError: {marks(path)}")
    started, cancelled = marks(path)
    assert 0.9 <= cancelled["at"] - started["at"] <= 2.0
    assert row["status"] == "FAILED"
    assert row["errors"][-1]["exception_class_path"] == "shardq.exceptions.TaskTimeout"
    assert "its coroutine was cancelled" in row["errors"][-1]["traceback"]


def test_a_late_completion_of_a_timed_out_attempt_is_refused(worker, tmp_path):
    path = tmp_path / "late"
    result = runctl_tasks.swallows_timeout.enqueue(str(path))
    wait_until(
        lambda: worker_stats(worker).get("late_completions_refused") == 1,
        timeout=30,
        message=lambda: worker_stats(worker),
    )
    assert events(path) == ["start", "caught"]
    # The outcome written at the deadline (the completer's write may land
    # after the late return is counted: the counter is this process's own).
    row = finished(result)
    assert row["status"] == "FAILED"
    assert row["return_value"] is None
    assert row["errors"][-1]["exception_class_path"] == "shardq.exceptions.TaskTimeout"


def running(result) -> bool:
    """Does the job's row read RUNNING? Only then does a cancel NOTIFY its
    worker (queries.sql cancel_jobs); before, the worker would learn of it at
    its next heartbeat."""
    return scalar("SELECT status FROM shardq_job WHERE id = %s", [int(result.id)]) == "RUNNING"


def cancel_when_started(result, path: Path) -> float:
    wait_until(lambda: events(path) == ["start"], timeout=30, interval=0.01)
    wait_until(lambda: running(result), timeout=10, interval=0.01, message="the job's row to read RUNNING")
    sent = time.time()
    assert shardq.cancel(result, reason="stop") == [result.id]
    return sent


def test_a_sync_task_sees_its_cancel_through_is_cancelled(worker, tmp_path):
    path = tmp_path / "cancel"
    result = runctl_tasks.waits_for_cancel.enqueue(str(path))
    sent = cancel_when_started(result, path)
    wait_until(lambda: len(marks(path)) == 2, timeout=30, message=lambda: marks(path))
    seen = marks(path)[1]
    assert seen["event"] == "cancelled"
    # From NOTIFY, not at the next heartbeat.
    assert seen["at"] - sent < 1.0
    assert job(result)["errors"][-1]["exception_class_path"] == "shardq.exceptions.Cancelled"
    wait_until(lambda: worker_stats(worker).get("cancels_seen") == 1, timeout=15)


def test_an_async_task_gets_cancelled_error_on_cancel(worker, tmp_path):
    path = tmp_path / "acancel"
    result = runctl_tasks.async_waits_for_cancel.enqueue(str(path))
    sent = cancel_when_started(result, path)
    wait_until(lambda: len(marks(path)) == 2, timeout=30, message=lambda: marks(path))
    seen = marks(path)[1]
    assert seen["event"] == "cancelled"
    assert seen["at"] - sent < 1.0
    assert job(result)["status"] == "FAILED"


def test_a_cancel_is_seen_at_the_heartbeat_without_notify(settings, tmp_path):
    settings.SHARDQ = {**settings.SHARDQ, "NOTIFY": False, "HEARTBEAT": 0.4, "LEASE_TTL": 2.0, "POLL_INTERVAL": 0.2}
    with in_process_worker(concurrency=2) as worker:
        assert worker.listener is None
        path = tmp_path / "beat"
        result = runctl_tasks.waits_for_cancel.enqueue(str(path))
        sent = cancel_when_started(result, path)
        wait_until(lambda: len(marks(path)) == 2, timeout=30, message=lambda: marks(path))
        assert marks(path)[1]["event"] == "cancelled"
        # Within a heartbeat (0.4 s) and a poll.
        assert marks(path)[1]["at"] - sent < 0.4 + 1.0


def test_a_task_reads_its_deadline_from_the_context_and_stops_itself(worker, tmp_path):
    path = tmp_path / "deadline"
    result = runctl_tasks.checks_its_deadline.enqueue(str(path))
    row = finished(result)
    start = marks(path)[0]
    assert 0.9 <= start["time_left"] <= 1.0
    assert abs(start["deadline"] - (start["at"] + start["time_left"])) < 0.2
    assert row["status"] == "FAILED"
    assert row["errors"][-1]["exception_class_path"] == "shardq.exceptions.TaskTimeout"
    # Whichever came first at the deadline (the task's check or the worker),
    # the TaskTimeout is not a late completion.
    assert not worker_stats(worker).get("late_completions_refused")


def test_cancel_latency_from_cancel_to_the_task_seeing_it(worker, tmp_path):
    """p50/p99 from ``shardq.cancel()`` returning to the task seeing it, sync
    (``is_cancelled()``, polled every millisecond) and async
    (``CancelledError``). CI runs 20 samples of each; ``make bench-cancel``
    runs SHARDQ_CANCEL_SAMPLES (200) and prints the figures (docs/benchmarks.md)."""
    import os
    import statistics

    samples = int(os.environ.get("SHARDQ_CANCEL_SAMPLES", "20"))
    figures = {}
    for kind, task in (("sync", runctl_tasks.waits_for_cancel), ("async", runctl_tasks.async_waits_for_cancel)):
        latencies = []
        for n in range(samples):
            path = tmp_path / f"{kind}-{n}"
            result = task.enqueue(str(path))
            wait_until(lambda path=path: events(path) == ["start"], timeout=30, interval=0.005)
            wait_until(lambda result=result: running(result), timeout=10, interval=0.002, message="RUNNING")
            sent = time.time()
            shardq.cancel(result)
            wait_until(lambda path=path: len(marks(path)) == 2, timeout=30, interval=0.002)
            seen = marks(path)[1]
            assert seen["event"] == "cancelled", seen
            latencies.append((seen["at"] - sent) * 1000)
        latencies.sort()
        figures[kind] = {
            "samples": samples,
            "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
            "max_ms": round(latencies[-1], 2),
        }
    print(f"\ncancel latency (load {os.getloadavg()[0]:.1f}): {json.dumps(figures)}")
    if os.environ.get("SHARDQ_CANCEL_RESULTS"):
        Path(os.environ["SHARDQ_CANCEL_RESULTS"]).write_text(json.dumps(figures, indent=2))
    # By NOTIFY: far inside the 5 s heartbeat that would be the fallback.
    assert figures["sync"]["p99_ms"] < 1000 and figures["async"]["p99_ms"] < 1000, figures
