"""Online resharding under load: ``shardq_reshard --to 128`` while ordered
jobs drain and a worker is SIGKILLed every 2 s (its supervisor restarts it).
Nothing is lost or committed twice (the invariants (a)–(e) of harness.py),
every unfinished job ends in ``key_hash & 127``, and each key's jobs ran one
after another in id order: no job of a key started before the previous one
had finished or been dead-lettered."""

import io
import os
import random
import signal
import threading
import time

import psutil
from django.core.management import call_command
from django.db import connection

import shardq
from tests.conftest import wait_until
from tests.faults.harness import check_invariants, figures, size, wait_all_finished
from tests.taskapp import fault_tasks
from tests.workers import query, scalar

WORKERS = 3
KEYS = size(150, 2000)
JOBS = size(3000, 100_000)
JOB_SECONDS = size(0.005, 0.0)
KILL_EVERY = 2.0
TARGET = 128


def children(supervisor) -> list[int]:
    return [p.pid for p in psutil.Process(supervisor.pid).children() if p.status() != psutil.STATUS_ZOMBIE]


def order_violations() -> list:
    """(key, job, its first start, the previous job, when that one finished)
    for every job that started before its key's previous job had finished."""
    return query(
        "WITH j AS ("
        "  SELECT id, shard_key, finished_at, lag(id) OVER w AS prev_id, lag(finished_at) OVER w AS prev_finished"
        "  FROM shardq_job WHERE ordered WINDOW w AS (PARTITION BY shard_key ORDER BY id)) "
        "SELECT j.shard_key, j.id, min(e.at), j.prev_id, j.prev_finished FROM j "
        "JOIN taskapp_execution e ON e.job_id = j.id WHERE j.prev_id IS NOT NULL "
        "GROUP BY 1, 2, 4, 5 HAVING j.prev_finished IS NULL OR min(e.at) < j.prev_finished LIMIT 20"
    )


def test_reshard_under_sigkill_churn_loses_nothing_runs_nothing_twice_and_keeps_per_key_order(workers):
    rng = random.Random(17)
    supervisor = workers.start("--processes", str(WORKERS), "--concurrency", "4")
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 64,
        timeout=90,
        message=f"{WORKERS} children to share the 64 shards",
    )
    # Keys in round robin: each key's jobs are spread over the whole drain.
    calls = [((), {"key": i % KEYS, "n": i, "sleep": JOB_SECONDS}) for i in range(JOBS)]
    for start in range(0, JOBS, 20_000):
        shardq.enqueue_many(fault_tasks.ordered_ledger, calls[start : start + 20_000])
    ready_at_switch = scalar("SELECT count(*) FROM shardq_job WHERE status = 'READY'")

    out, err = io.StringIO(), io.StringIO()
    timing: dict[str, float] = {}

    def reshard() -> None:
        began = time.monotonic()
        try:
            call_command("shardq_reshard", "--to", str(TARGET), "--no-progress", stdout=out, stderr=err)
        finally:
            timing["seconds"] = time.monotonic() - began
            connection.close()

    thread = threading.Thread(target=reshard, name="reshard")
    thread.start()
    kills = 0
    # Kill through the reshard and the drain (at least a few kills during the reshard).
    while thread.is_alive() or (
        kills < size(6, 20) and scalar("SELECT count(*) FROM shardq_job WHERE status NOT IN ('SUCCESSFUL', 'FAILED')")
    ):
        pids = wait_until(lambda: len(c := children(supervisor)) >= 2 and c, timeout=60, message="two children")
        os.kill(rng.choice(sorted(pids)), signal.SIGKILL)
        kills += 1
        thread.join(KILL_EVERY)
    assert "resharded 64 → 128" in out.getvalue(), (out.getvalue(), err.getvalue())

    wait_all_finished(query, JOBS, timeout=size(300, 3600))
    wait_until(
        lambda: (
            scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL AND lease_expires > clock_timestamp()")
            == TARGET
        ),
        timeout=30,
        message="all 128 shards owned after the reshard",
    )
    assert supervisor.poll() is None
    report = check_invariants(query, expected_jobs=JOBS, shard_count=TARGET)
    assert order_violations() == []
    assert scalar("SELECT shard_count FROM shardq_cluster") == TARGET
    assert scalar("SELECT reshard_from FROM shardq_cluster") is None
    # Jobs that were READY at the switch and claimed after it ran in their new shard.
    assert scalar("SELECT count(*) FROM shardq_job WHERE shard >= 64") > 0
    assert scalar("SELECT count(*) FROM shardq_job WHERE shard <> key_hash & 127 AND finished_at IS NULL") == 0
    figures(
        "reshard_under_churn",
        jobs=JOBS,
        ready_at_switch=ready_at_switch,
        reshard_seconds=timing["seconds"],
        kills=kills,
        **{k: report[k] for k in ("statuses", "executions", "extra_executions", "rescued", "double_commits", "lost")},
    )
