"""Fault 1: SIGKILL a worker every 2 s while a supervisor restarts it; every
killed worker's shards are owned again within TTL + a heartbeat, and the
guarantees (a)–(e) hold once the jobs drain."""

import os
import random
import signal
import time

import psutil

import shardq
from tests.faults.harness import HEARTBEAT, TTL, check_invariants, figures, percentile, size, wait_all_finished
from tests.helpers import wait_until
from tests.taskapp import fault_tasks
from tests.workers import query, scalar

WORKERS = size(3, 4)
JOBS = size(2000, 20000)
# Full size: enough work (≈ 50 s at 16 threads) to span the 20 kills the test asks for.
JOB_SECONDS = size(0.05, 0.04)
CHURN_SECONDS = size(20, 90)
KILL_EVERY = 2.0
# Lease expiry is at most TTL after the victim's last renewal; survivors see it
# at their next round (≤ one heartbeat); the slack covers a loaded 2-core box.
TAKEOVER_BOUND = TTL + HEARTBEAT + 1.0


def live_children(supervisor) -> dict[int, str]:
    """pid -> incarnation id of the supervisor's children that hold shards."""
    pids = [p.pid for p in psutil.Process(supervisor.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
    if not pids:
        return {}
    rows = query(
        "SELECT w.pid, w.id::text FROM shardq_worker w WHERE w.pid = ANY(%s) AND w.state = 'RUNNING' "
        "AND EXISTS (SELECT 1 FROM shardq_shard s WHERE s.owner = w.id AND s.lease_expires > clock_timestamp())",
        [pids],
    )
    return dict(rows)


def orphaned(victim: str, shards: list[int]) -> int:
    """How many of ``shards`` are not yet held (live lease) by a worker other than ``victim``."""
    return scalar(
        "SELECT count(*) FROM shardq_shard WHERE shard = ANY(%s) AND (owner IS NULL OR owner = %s "
        "OR lease_expires <= clock_timestamp())",
        [shards, victim],
    )


def test_sigkill_churn_keeps_every_guarantee_and_rehomes_shards_within_ttl(workers):
    rng = random.Random(1)
    supervisor = workers.start("--processes", str(WORKERS), "--concurrency", "4")
    wait_until(
        lambda: (
            len(live_children(supervisor)) == WORKERS
            and scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 64
        ),
        timeout=90,
        message=f"{WORKERS} children to share the 64 shards",
    )
    shardq.enqueue_many(fault_tasks.tx_ledger, [((), {"n": i, "sleep": JOB_SECONDS}) for i in range(JOBS)])

    takeovers: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < CHURN_SECONDS and scalar(
        "SELECT count(*) FROM shardq_job WHERE status NOT IN ('SUCCESSFUL', 'FAILED')"
    ):
        kill_at = time.monotonic()
        # Never kill the last live worker: with nobody left to take over there
        # is no takeover to time (a restart can take seconds on a loaded box).
        children = wait_until(
            lambda: len(c := live_children(supervisor)) >= 2 and c, timeout=60, message="two children holding shards"
        )
        pid, victim = rng.choice(sorted(children.items()))
        shards = [s for (s,) in query("SELECT shard FROM shardq_shard WHERE owner = %s", [victim])]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(
            lambda: orphaned(victim, shards) == 0,
            timeout=30,
            interval=0.05,
            message=f"the {len(shards)} shards of killed worker {victim} to be owned again",
        )
        takeovers.append(time.monotonic() - killed)
        pause = kill_at + KILL_EVERY - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the kills: one every KILL_EVERY seconds at most

    wait_all_finished(query, JOBS, timeout=size(240, 900))
    wait_until(
        lambda: (
            scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL AND lease_expires > clock_timestamp()")
            == 64
        ),
        timeout=30,
        message="every shard owned after the churn",
    )
    assert supervisor.poll() is None
    report = check_invariants(query, expected_jobs=JOBS)
    assert report["statuses"] == {"SUCCESSFUL": JOBS}, (
        report,
        query(
            "SELECT id, attempts, worker_losses, errors FROM shardq_job WHERE status <> 'SUCCESSFUL' ORDER BY id LIMIT 5"
        ),
    )
    figures(
        "sigkill_churn",
        workers=WORKERS,
        jobs=JOBS,
        kills=len(takeovers),
        takeover_p50=percentile(takeovers, 50),
        takeover_max=max(takeovers),
        **{
            k: report[k]
            for k in (
                "executions",
                "extra_executions",
                "rescued",
                "reexecutions",
                "fence_rejections",
                "double_commits",
                "lost",
            )
        },
    )
    assert len(takeovers) >= size(5, 20)
    assert max(takeovers) <= TAKEOVER_BOUND, f"takeover times {sorted(takeovers)}"
