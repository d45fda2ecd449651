"""Fault 6: a rolling restart — SIGTERM each of the workers in turn (a fresh one
replaces it) while jobs shorter than the grace period run: no job runs twice,
and every lease is released, never left to expire."""

import signal

import shardq
from tests.faults.harness import check_invariants, figures, size, wait_all_finished
from tests.helpers import wait_until
from tests.taskapp import fault_tasks
from tests.workers import query, scalar, shards_by_owner, worker_id_of, worker_stats

WORKERS = 4
JOBS_PER_STEP = size(150, 1000)
JOB_SECONDS = 0.2
GRACE = 10


def test_sigterm_one_worker_after_another_reruns_nothing_and_releases_every_lease(workers):
    procs = [workers.start("--concurrency", "2", "--grace", str(GRACE)) for _ in range(WORKERS)]
    ids = [worker_id_of(p.pid) for p in procs]
    wait_until(
        lambda: len(shards_by_owner()) == WORKERS and sum(shards_by_owner().values()) == 64,
        timeout=60,
        message="four workers to share the shards",
    )
    total, stopped = 0, []
    for step in range(WORKERS):
        shardq.enqueue_many(
            fault_tasks.tx_ledger, [((), {"n": step, "sleep": JOB_SECONDS}) for _ in range(JOBS_PER_STEP)]
        )
        total += JOBS_PER_STEP
        old, old_id = procs[step], ids[step]
        wait_until(
            lambda: (
                scalar("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING' AND worker_ids->>-1 = %s", [old_id])
                > 0
            ),
            timeout=30,
            message=f"worker {old_id} to be running jobs",
        )
        held = scalar("SELECT count(*) FROM shardq_shard WHERE owner = %s", [old_id])
        old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=GRACE + 20) == 0
        stopped.append((old_id, held))
        fresh = workers.start("--concurrency", "2", "--grace", str(GRACE))
        fresh_id = worker_id_of(fresh.pid)
        wait_until(
            lambda: fresh_id in shards_by_owner() and sum(shards_by_owner().values()) == 64,
            timeout=60,
            message="the replacement to hold shards",
        )
    wait_all_finished(query, total, timeout=size(120, 600))

    report = check_invariants(query, expected_jobs=total)
    assert report["statuses"] == {"SUCCESSFUL": total}, report
    assert report["executions"] == total and report["extra_executions"] == 0, "a job ran twice"
    assert scalar("SELECT count(*) FROM shardq_shard_event WHERE reason = 'takeover'") == 0, "a lease expired"
    assert report["rescued"] == 0
    for worker_id, _ in stopped:
        assert scalar("SELECT state FROM shardq_worker WHERE id = %s", [worker_id]) == "STOPPED"
        assert scalar("SELECT count(*) FROM shardq_shard WHERE owner = %s", [worker_id]) == 0
        claimed = scalar(
            "SELECT count(*) FROM shardq_shard_event WHERE worker = %s AND reason <> 'release'", [worker_id]
        )
        released = scalar(
            "SELECT count(*) FROM shardq_shard_event WHERE worker = %s AND reason = 'release'", [worker_id]
        )
        assert claimed == released, f"worker {worker_id} claimed {claimed} shard versions, released {released}"
        assert worker_stats(worker_id).get("releases") == released
    figures(
        "rolling_restart",
        workers=WORKERS,
        restarts=len(stopped),
        jobs=total,
        reexecutions=report["extra_executions"],
        takeovers=0,
        releases=scalar("SELECT count(*) FROM shardq_shard_event WHERE reason = 'release'"),
    )
