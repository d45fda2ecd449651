"""Started is started (issue 24): a job reads RUNNING, gets ``started_at``
and uses an attempt only when a thread begins its function, never while it
waits for a thread or for a limit slot. A worker in this process with four
threads and a task capped at two at once: the table never shows more than
two RUNNING, and each job's ``started_at`` is its function's start, not a
wait earlier."""

import threading
from datetime import datetime

import pytest
from django.db import connection

import shardq
from tests.helpers import in_process_worker, scalar, sql, wait_until
from tests.taskapp import limit_tasks

pytestmark = pytest.mark.django_db(transaction=True)

SLEEP = 0.5


@pytest.mark.parametrize("task", [limit_tasks.two_per_customer, limit_tasks.two_per_key], ids=["slots", "shard-key"])
def test_jobs_waiting_for_a_limit_slot_read_claimed_and_start_when_their_function_does(task, tmp_path, monkeypatch):
    ledger = tmp_path / "ledger"
    monkeypatch.setenv("SHARDQ_LIMIT_LEDGER", str(ledger))
    running_seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.is_set():
                running_seen.append(scalar("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING'"))
                stop.wait(0.01)
        finally:
            connection.close()  # this thread's own

    with in_process_worker(concurrency=4):
        results = shardq.enqueue_many(task, [((), {"customer": "acme", "n": i, "sleep": SLEEP}) for i in range(8)])
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            wait_until(
                lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == 8,
                timeout=60,
                message="the 8 jobs to finish",
            )
        finally:
            stop.set()
            sampler.join()
    assert max(running_seen) == 2, f"RUNNING counts seen: {sorted(set(running_seen))} (cap 2)"
    began = {
        int(job): float(at)
        for event, job, at, *_ in (line.split() for line in ledger.read_text().splitlines())
        if event == "start"
    }
    rows = sql(
        "SELECT id, started_at, attempts, jsonb_array_length(worker_ids) FROM shardq_job WHERE id = ANY(%s)",
        [[int(result.id) for result in results]],
    )
    for job_id, started_at, attempts, workers in rows:
        assert (attempts, workers) == (1, 1)
        started: datetime = started_at
        # The database's clock and the worker's wall clock are this
        # machine's one clock. A job started before it waited for its slot
        # would show a start a whole run (SLEEP) or more before its function's.
        lead = began[job_id] - started.timestamp()
        assert -0.05 < lead < SLEEP / 2, f"job {job_id}: started_at {lead:.3f}s before its function began"
