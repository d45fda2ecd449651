"""Run control that needs a worker process of its own: a task stuck in C
kept as a zombie thread, and the zombie limit replacing the process. The
rest of run control (timeouts, the late write, cancellation) runs in-process:
tests/integration/test_run_control.py. Task bodies: tests/taskapp/runctl_tasks.py."""

import json
import time
from pathlib import Path

import pytest

import shardq
from tests.conftest import wait_until
from tests.taskapp import runctl_tasks
from tests.workers import query, scalar, shards_by_owner, worker_id_of, worker_stats

pytestmark = pytest.mark.django_db(transaction=True)


def marks(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(path: Path) -> list[str]:
    return [m["event"] for m in marks(path)]


def job(result) -> dict:
    row = query(
        "SELECT status, errors::text, return_value::text, attempts FROM shardq_job WHERE id = %s", [int(result.id)]
    )[0]
    return {"status": row[0], "errors": json.loads(row[1]), "return_value": row[2], "attempts": row[3]}


def start_worker(workers, *args, env=None):
    proc = workers.start("--concurrency", "2", *args, env=env)
    wid = worker_id_of(proc.pid)
    wait_until(lambda: shards_by_owner().get(wid) == 64, timeout=30, message="the worker to hold every shard")
    return proc, wid


def finished(result):
    return wait_until(
        lambda: (row := job(result))["status"] in ("FAILED", "SUCCESSFUL") and row,
        timeout=30,
        interval=0.05,
        message=lambda: f"job {result.id} to finish: {job(result)}",
    )


def test_a_task_stuck_in_c_is_failed_at_its_deadline_and_kept_as_a_zombie(workers, tmp_path):
    proc, wid = start_worker(workers)
    path = tmp_path / "stuck"
    result = runctl_tasks.stuck_in_c.enqueue(str(path))
    wait_until(lambda: events(path) == ["start"], timeout=30)
    began = marks(path)[0]["at"]
    row = finished(result)
    # FAILED at the deadline, while the thread is still asleep in C.
    assert time.time() - began < 1 + 1.5
    assert row["status"] == "FAILED"
    assert row["errors"][-1]["exception_class_path"] == "shardq.exceptions.TaskTimeout"
    wait_until(
        lambda: worker_stats(wid).get("zombies") == 1,
        timeout=15,
        message=lambda: f"the zombie in the worker's stats: {worker_stats(wid)}",
    )
    # The zombie keeps its slot; the other thread still works (one zombie is
    # within the default MAX_ZOMBIES = 2: no recycling).
    after = runctl_tasks.quick.enqueue(str(tmp_path / "quick"), 1)
    assert finished(after)["status"] == "SUCCESSFUL"
    assert proc.poll() is None
    assert "kept as a zombie" in workers.log(proc)
    # shardq_status shows it.
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("shardq_status", stdout=out)
    assert "zombies=1" in out.getvalue()


def test_the_zombie_limit_replaces_the_process_and_nothing_is_lost(workers, tmp_path):
    proc = workers.start("--processes", "2", "--concurrency", "2", env={"SHARDQ_MAX_ZOMBIES": "0"})
    wait_until(
        lambda: sum(shards_by_owner().values()) == 64 and len(shards_by_owner()) == 2,
        timeout=60,
        message="two worker processes to share the shards",
    )
    first_pids = set(workers.children(proc))
    quick_path = tmp_path / "quick"
    jobs = [runctl_tasks.quick.enqueue(str(quick_path), n) for n in range(40)]
    stuck = runctl_tasks.stuck_in_c.enqueue(str(tmp_path / "stuck"))
    assert finished(stuck)["status"] == "FAILED"
    # One zombie is over MAX_ZOMBIES = 0: that process exits 3 and a fresh one takes its place.
    wait_until(
        lambda: len(set(workers.children(proc)) - first_pids) == 1,
        timeout=60,
        message=lambda: f"a fresh worker process: {workers.log(proc)[-3000:]}",
    )
    assert "exited with 3 (replaced: threads stuck past their timeout): restarting" in workers.log(proc)
    for result in jobs:
        assert finished(result)["status"] == "SUCCESSFUL"
    ran = sorted(m["n"] for m in marks(quick_path))
    assert set(ran) == set(range(40))
    # The replaced process said goodbye: stopped, its shards released, not left to expire.
    assert scalar("SELECT count(*) FROM shardq_worker WHERE state = 'STOPPED'") == 1
    assert scalar("SELECT count(*) FROM shardq_job WHERE status NOT IN ('SUCCESSFUL', 'FAILED')") == 0


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


# Heartbeats 5 s apart: a cancel seen within a second came by NOTIFY.
SLOW_HEARTBEAT = {"SHARDQ_HEARTBEAT": "5", "SHARDQ_LEASE_TTL": "15"}
