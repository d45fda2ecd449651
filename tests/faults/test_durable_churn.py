"""Durable iterations under faults (issue 26): the job's owner SIGKILLed again
and again, and rolling deploys by SIGTERM. Every item lands in the ledger
exactly once (each batch's writes commit with its fenced cursor, or roll back
with it); a graceful stop hands the job back at the next batch without using
an attempt. CI sizes in `make test`, the issue's with `make durable`
(SHARDQ_FULL_FAULTS=1)."""

import json
import os
import signal
import time

from tests.faults.harness import figures, size
from tests.helpers import wait_until
from tests.taskapp import durable_tasks
from tests.taskapp.models import Item
from tests.workers import query, scalar, shards_by_owner, worker_id_of

ITEMS = size(2000, 20000)
BATCH = 100


def make_items() -> None:
    Item.objects.bulk_create((Item(tenant=1, n=i) for i in range(ITEMS)), batch_size=5000)


def owner_pid(job_id: int) -> int | None:
    """The pid of the worker running the job now (None: not running)."""
    row = query(
        "SELECT w.pid FROM shardq_job j JOIN shardq_worker w ON w.id::text = j.worker_ids->>-1 "
        "WHERE j.id = %s AND j.status = 'RUNNING' AND w.state = 'RUNNING'",
        [job_id],
    )
    return row[0][0] if row else None


def job_status(job_id: int) -> str:
    return scalar("SELECT status FROM shardq_job WHERE id = %s", [job_id])


def ledger_report(job_id: int) -> dict:
    counts = dict(
        query("SELECT item_id, count(*) FROM taskapp_itemledger WHERE job_id = %s GROUP BY item_id", [job_id])
    )
    runs = dict(query("SELECT first_item, count(*) FROM taskapp_batchrun WHERE job_id = %s GROUP BY 1", [job_id]))
    return {
        "items": len(counts),
        "duplicates": sum(1 for n in counts.values() if n > 1),
        "batches_committed": scalar(
            "SELECT batches FROM shardq_job_step WHERE job_id = %s AND kind = 'iterate'", [job_id]
        )
        or 0,
        "batches_begun": sum(runs.values()),
        "batches_run_twice": sum(n - 1 for n in runs.values()),
    }


def test_sigkill_of_the_owner_again_and_again_commits_every_item_exactly_once(workers):
    make_items()
    supervisor = workers.start("--processes", "3", "--concurrency", "2")
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 64,
        timeout=90,
        message="three children to share the 64 shards",
    )
    # ~6 s of batches at CI size (20 x 0.3 s), ~40 s at full size (200 x 0.2 s).
    result = durable_tasks.churn_backfill.enqueue(tenant=1, size=BATCH, pause=size(0.3, 0.2))
    job_id = int(result.id)
    killed: set[int] = set()

    def running_on_a_live_worker():
        pid = owner_pid(job_id)
        return (pid if pid not in killed else None) or job_status(job_id) in ("SUCCESSFUL", "FAILED")

    while job_status(job_id) not in ("SUCCESSFUL", "FAILED"):
        pid = wait_until(running_on_a_live_worker, timeout=60, message="the job to run on a live worker")
        if pid is True:
            break
        time.sleep(2.0)  # pacing: the owner is killed 2 s into its run
        if owner_pid(job_id) == pid:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
    kills = len(killed)
    assert supervisor.poll() is None
    assert job_status(job_id) == "SUCCESSFUL", query("SELECT status, errors FROM shardq_job WHERE id = %s", [job_id])
    report = ledger_report(job_id)
    assert report["items"] == ITEMS and report["duplicates"] == 0, report
    assert report["batches_committed"] == ITEMS // BATCH
    assert kills >= 2
    # A batch runs twice only when a kill caught it before its commit.
    assert report["batches_run_twice"] <= kills
    figures("durable_sigkill_churn", batch=BATCH, kills=kills, **report)


def run_uninterrupted(tenant: int, pause: float) -> float:
    """Wall seconds of the deploy test's job with no deploy (its baseline)."""
    began = time.monotonic()
    result = durable_tasks.churn_backfill.enqueue(tenant=tenant, size=BATCH, pause=pause)
    wait_until(lambda: job_status(int(result.id)) == "SUCCESSFUL", timeout=size(120, 600))
    return time.monotonic() - began


def test_rolling_deploys_hand_the_job_back_at_a_batch_and_never_use_an_attempt(workers):
    """Each deploy as a rolling update makes it: the new version's worker is
    started and has joined (holds its share), then the job's owner gets
    SIGTERM. Per deploy at most the batch in flight is redone (none: the
    stop waits for it), the attempt count stays 1, and the job runs again
    elsewhere within the batch in flight plus a lease handover."""
    deploys = size(2, 10)
    batches = size(30, 120)
    pause = 0.5  # 15 s of batches at CI size, 60 s at full size
    Item.objects.bulk_create((Item(tenant=t, n=i) for t in (2, 3) for i in range(batches * BATCH)), batch_size=5000)
    start = ("--concurrency", "2", "--grace", "10")
    procs = [workers.start(*start), workers.start(*start)]
    wait_until(
        lambda: len(shards_by_owner()) == 2 and sum(shards_by_owner().values()) == 64,
        timeout=90,
        message="two workers to share the 64 shards",
    )
    baseline = run_uninterrupted(3, pause)
    began = time.monotonic()
    result = durable_tasks.churn_backfill.enqueue(tenant=2, size=BATCH, pause=pause)
    job_id = int(result.id)
    # The deploys are spread over the uninterrupted run's length.
    interval = batches * pause / (deploys + 1)
    gaps: list[float] = []
    fresh = workers.start(*start)
    while len(gaps) < deploys:
        # The new version's worker has joined: it holds shards.
        fresh_id = worker_id_of(fresh.pid, timeout=90)
        wait_until(lambda: shards_by_owner().get(fresh_id, 0) > 0, timeout=90, message="the fresh worker to join")
        time.sleep(max(0.0, began + (len(gaps) + 1) * interval - time.monotonic()))  # pacing the deploys
        pid = wait_until(
            lambda: owner_pid(job_id) or job_status(job_id) == "SUCCESSFUL",
            timeout=60,
            message="the job to run on a worker",
        )
        if pid is True:
            break
        old = next(p for p in [*procs, fresh] if p.pid == pid)
        stopped_at = time.monotonic()
        old.send_signal(signal.SIGTERM)
        # Running again on another worker: the batch in flight, the hand-back,
        # the release, the next owner's claim.
        wait_until(
            lambda: owner_pid(job_id) not in (None, pid) or job_status(job_id) == "SUCCESSFUL",
            timeout=60,
            message="the job to run again on another worker",
        )
        gaps.append(time.monotonic() - stopped_at)
        assert old.wait(timeout=30) == 0, workers.log(old)[-4000:]  # handed back well inside the grace
        if old is not fresh:
            procs.remove(old)
            procs.append(fresh)
        assert scalar("SELECT attempts FROM shardq_job WHERE id = %s", [job_id]) <= 1
        # Per deploy at most the batch in flight is redone.
        assert ledger_report(job_id)["batches_run_twice"] <= len(gaps)
        fresh = workers.start(*start)
    wait_until(lambda: job_status(job_id) == "SUCCESSFUL", timeout=size(120, 600))
    wall = time.monotonic() - began
    attempts, worker_ids = query("SELECT attempts, worker_ids FROM shardq_job WHERE id = %s", [job_id])[0]
    report = ledger_report(job_id)
    assert report["items"] == batches * BATCH and report["duplicates"] == 0, report
    worker_ids = json.loads(worker_ids) if isinstance(worker_ids, str) else worker_ids
    handed_back = scalar("SELECT sum((stats->>'handed_back_at_boundary')::int) FROM shardq_worker")
    assert attempts == 1 == len(worker_ids)
    assert len(gaps) >= size(1, deploys)
    # A graceful stop waits for the batch in flight: none is redone.
    assert report["batches_run_twice"] == 0, report
    gaps.sort()
    figures(
        "durable_rolling_deploys",
        deploys=len(gaps),
        handed_back=handed_back,
        attempts=attempts,
        wall_seconds=wall,
        uninterrupted_seconds=baseline,
        work_seconds=batches * pause,
        gap_median_seconds=gaps[len(gaps) // 2],
        gap_max_seconds=gaps[-1],
        **report,
    )


def test_a_zombies_batch_rolls_back_when_it_wakes_after_another_worker_resumed_the_job(workers):
    from tests.faults.harness import TTL
    from tests.workers import worker_stats

    make_items()
    procs = [workers.start("--concurrency", "2", "--grace", "10") for _ in range(2)]
    ids = {p.pid: worker_id_of(p.pid) for p in procs}
    wait_until(
        lambda: sum(shards_by_owner().values()) == 64 and len(shards_by_owner()) == 2,
        timeout=60,
        message="both workers to hold shards",
    )
    # 1 s a batch, inside the batch's transaction: a pause lands mid-batch.
    result = durable_tasks.churn_backfill.enqueue(tenant=1, size=BATCH, pause=1.0)
    job_id = int(result.id)
    pid = wait_until(lambda: owner_pid(job_id), timeout=60, message="the job to run")
    wait_until(lambda: ledger_report(job_id)["batches_committed"] >= 2, timeout=60)
    time.sleep(0.5)  # pacing: into the next batch, before its commit
    zombie = next(p for p in procs if p.pid == pid)
    other = next(i for p, i in ids.items() if p != pid)
    zombie.send_signal(signal.SIGSTOP)
    committed_at_pause = ledger_report(job_id)["batches_committed"]
    try:
        time.sleep(3 * TTL)  # pacing: the pause itself
        wait_until(lambda: shards_by_owner() == {other: 64}, timeout=30, message="the live worker to take over")
        # The other worker resumes the job after the last committed batch.
        wait_until(lambda: ledger_report(job_id)["batches_committed"] > committed_at_pause + 1, timeout=60)
    finally:
        zombie.send_signal(signal.SIGCONT)
    # On waking, the zombie finishes its batch's body; its cursor write is
    # refused (the fence moved on) and the batch rolls back.
    wait_until(lambda: worker_stats(ids[pid]).get("fence_rejections", 0) >= 1, timeout=30)
    wait_until(lambda: job_status(job_id) == "SUCCESSFUL", timeout=size(120, 600))
    report = ledger_report(job_id)
    assert report["items"] == ITEMS and report["duplicates"] == 0, report
    # The zombie's batch was begun twice: once by it (rolled back), once by the new owner.
    assert report["batches_run_twice"] == 1, report
    figures("durable_zombie", rejections=worker_stats(ids[pid]).get("fence_rejections", 0), **report)
