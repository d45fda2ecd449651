"""Workflows under SIGKILL churn (issue 16): a worker is killed every 2 s
while a supervisor restarts it and the resolvers move children on. At the
end every edge was respected, by the execution log (no child executed
before its parent's outcome was written), nothing is stuck WAITING or with
children not moved on, and the guarantees (a)-(e) hold."""

import os
import random
import signal

from shardq import Workflow
from tests.faults.harness import (
    check_invariants,
    churn_victims,
    figures,
    live_children,
    lost_to_survivors,
    size,
    wait_all_finished,
)
from tests.helpers import wait_until
from tests.taskapp import fault_tasks
from tests.workers import query, scalar

WORKERS = size(3, 4)
WORKFLOWS = size(60, 300)
MIDDLE = 8  # each workflow: 1 -> 8 -> 1
# Enough work to span the kills (4, full size 15): a dead worker's shards
# are taken over in a fraction of a second (dead-owner detection), not after
# its lease, so the work alone must outlast the churn's pace.
JOB_SECONDS = size(0.15, 0.2)
CHURN_SECONDS = size(15, 60)
KILL_EVERY = 2.0


def enqueue_workflows() -> int:
    for n in range(WORKFLOWS):
        wf = Workflow(name=f"churn-{n}")
        root = wf.add(fault_tasks.tx_ledger, n=n, sleep=JOB_SECONDS)
        middle = [wf.add(fault_tasks.tx_ledger, n=n, sleep=JOB_SECONDS, after=[root]) for _ in range(MIDDLE)]
        wf.add(fault_tasks.tx_ledger, n=n, sleep=JOB_SECONDS, after=middle)
        wf.enqueue()
    return WORKFLOWS * (MIDDLE + 2)


def test_sigkill_churn_respects_every_edge_and_leaves_nothing_waiting(workers):
    rng = random.Random(16)
    supervisor = workers.start("--processes", str(WORKERS), "--concurrency", "4")
    wait_until(
        lambda: (
            len(live_children(supervisor, query)) == WORKERS
            and scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 64
        ),
        timeout=90,
        message=f"{WORKERS} children to share the 64 shards",
    )
    total = enqueue_workflows()
    killed: set[str] = set()
    for pid, victim in churn_victims(supervisor, query, rng, CHURN_SECONDS, KILL_EVERY):
        os.kill(pid, signal.SIGKILL)
        killed.add(victim)
    kills = len(killed)

    wait_all_finished(query, total, timeout=size(240, 900))
    # Nothing stuck: no job waits, no finished parent is left unresolved.
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_job WHERE children_pending") == 0,
        timeout=30,
        message="every finished parent's children moved on",
    )
    assert scalar("SELECT count(*) FROM shardq_job WHERE status = 'WAITING'") == 0
    assert scalar("SELECT count(*) FROM shardq_edge WHERE NOT resolved") == 0
    # Every edge, by the execution log: a child's first execution came after
    # its parent's outcome was written (the DB clock on both sides).
    early = query(
        """
        SELECT e.parent, e.child, p.finished_at, min(x.at)
        FROM shardq_edge AS e
        JOIN shardq_job AS p ON p.id = e.parent
        JOIN taskapp_execution AS x ON x.job_id = e.child
        GROUP BY e.parent, e.child, p.finished_at
        HAVING p.finished_at IS NULL OR min(x.at) < p.finished_at
        LIMIT 10
        """
    )
    assert early == [], early
    # A child ran only after every parent succeeded (on_parent_failure="cancel").
    ran_after_failure = query(
        """
        SELECT e.child FROM shardq_edge AS e JOIN shardq_job AS p ON p.id = e.parent
        WHERE p.status <> 'SUCCESSFUL' AND EXISTS (SELECT 1 FROM taskapp_execution x WHERE x.job_id = e.child)
        LIMIT 10
        """
    )
    assert ran_after_failure == []
    statuses = dict(query("SELECT status, count(*) FROM shardq_job GROUP BY 1"))
    parent_failed = scalar("SELECT count(*) FROM shardq_job WHERE errors::text LIKE '%%ParentFailed%%'")
    if statuses == {"SUCCESSFUL": total}:
        report = check_invariants(query, expected_jobs=total)
    else:
        # A parent dead-lettered as WorkerLost (its losses used up) cancels its
        # children: they end FAILED with ParentFailed, never run.
        assert parent_failed == statuses.get("FAILED", 0) - scalar(
            "SELECT count(*) FROM shardq_job WHERE errors::text LIKE '%%WorkerLost%%' AND status = 'FAILED'"
        ), statuses
        report = {"executions": scalar("SELECT count(*) FROM taskapp_execution")}
    assert lost_to_survivors(query, killed) == []
    assert supervisor.poll() is None
    finish_to_start = [
        float(r[0])
        for r in query(
            """SELECT extract(epoch FROM c.last_attempted_at - max(p.finished_at)) * 1000
               FROM shardq_edge AS e JOIN shardq_job AS p ON p.id = e.parent JOIN shardq_job AS c ON c.id = e.child
               WHERE c.status = 'SUCCESSFUL' GROUP BY c.id, c.last_attempted_at"""
        )
    ]
    figures(
        "workflow_churn",
        workers=WORKERS,
        jobs=total,
        kills=kills,
        parent_failed=parent_failed,
        executions=report.get("executions"),
        finish_to_start_p50_ms=sorted(finish_to_start)[len(finish_to_start) // 2],
    )
    assert kills >= size(4, 15)
