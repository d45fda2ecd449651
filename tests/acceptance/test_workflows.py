"""Workflows run by real ``shardq_worker`` processes (issue 16): every edge
respected by the ledger, parent results passed down, ParentFailed through a
real dead-letter, and the time from a parent's finish to its child's start.

``SHARDQ_FULL_WORKFLOWS=1`` (``make workflows``) runs the fan-out/fan-in at
the issue's size, 1 -> 9,998 -> 1; ``make test`` runs 1 -> 998 -> 1."""

import os

from django.db import transaction

from shardq import Workflow
from tests.helpers import wait_until
from tests.taskapp.tasks import fail, wf_fan_in, wf_node
from tests.workers import query, scalar, status_counts

FULL = bool(os.environ.get("SHARDQ_FULL_WORKFLOWS"))
MIDDLE = 9_998 if FULL else 998


def edge_violations() -> int:
    """Edges whose child started before its parent finished (or started at
    all after a failed parent, unless it asked to run)."""
    return scalar(
        """
        SELECT count(*) FROM shardq_edge AS e
        JOIN shardq_job AS p ON p.id = e.parent JOIN shardq_job AS c ON c.id = e.child
        WHERE c.started_at IS NOT NULL
          AND (p.finished_at IS NULL OR c.started_at < p.finished_at
               OR (p.status <> 'SUCCESSFUL' AND NOT e.run_on_failure))
        """
    )


def finish_to_start_ms() -> list[float]:
    """For each child that ran: its start minus its last parent's finish (ms)."""
    rows = query(
        """
        SELECT extract(epoch FROM c.last_attempted_at - max(p.finished_at)) * 1000
        FROM shardq_edge AS e
        JOIN shardq_job AS p ON p.id = e.parent JOIN shardq_job AS c ON c.id = e.child
        WHERE c.last_attempted_at IS NOT NULL GROUP BY c.id, c.last_attempted_at
        """
    )
    return sorted(float(r[0]) for r in rows)


def test_the_order_workflow_runs_in_order_and_children_read_their_parents_results(workers):
    workers.start("--concurrency", "4")
    with transaction.atomic():
        wf = Workflow(name="order-7")
        charge = wf.add(wf_node, "charge")
        pack = wf.add(wf_node, "pack", after=[charge])
        mail = wf.add(wf_node, "mail", after=[charge])
        wf.add(wf_node, "done", after=[pack, mail])
        results = wf.enqueue()
    wait_until(
        lambda: status_counts() == {"SUCCESSFUL": 4},
        timeout=20,
        message=lambda: (
            query("SELECT id, status, waiting_on, children_pending, finished_at FROM shardq_job ORDER BY id")
            + query("SELECT * FROM shardq_edge")
        ),
    )
    done = results[-1]
    done.refresh()
    assert done.return_value == {
        "tag": "done",
        "parents": {"wf_node[2]": ["SUCCESSFUL", "pack"], "wf_node[3]": ["SUCCESSFUL", "mail"]},
    }
    assert edge_violations() == 0


def test_a_dead_lettered_parent_cancels_its_children_and_run_children_see_the_failure(workers):
    workers.start("--concurrency", "2")
    wf = Workflow()
    bad = wf.add(fail, "boom", step_name="bad")
    skipped = wf.add(wf_node, "skipped", after=[bad])
    wf.add(wf_node, "after-skipped", after=[skipped])
    wf.add(wf_node, "cleanup", after=[bad], on_parent_failure="run")
    results = wf.enqueue()
    wait_until(lambda: status_counts() == {"FAILED": 3, "SUCCESSFUL": 1}, timeout=60, message=status_counts)
    for result in results:
        result.refresh()
    assert results[1].errors[-1].exception_class_path == "shardq.exceptions.ParentFailed"
    assert results[2].errors[-1].exception_class_path == "shardq.exceptions.ParentFailed"
    assert f"parent job {results[1].id} " in results[2].errors[-1].traceback
    assert results[3].return_value == {"tag": "cleanup", "parents": {"bad": ["FAILED", None]}}
    # The cancelled ones never ran: no ledger row, no attempt.
    assert (
        scalar("SELECT count(*) FROM taskapp_ledger WHERE job_id = ANY(%s)", [[int(results[1].id), int(results[2].id)]])
        == 0
    )
    assert edge_violations() == 0


def test_a_fan_out_fan_in_over_three_workers_starts_the_fan_in_after_every_parent(workers):
    for _ in range(3):
        workers.start("--concurrency", "4")
    wf = Workflow(name="fan")
    root = wf.add(wf_node, "root", read_parents=False)
    middle = [wf.add(wf_node, f"m{i}", after=[root], read_parents=False) for i in range(MIDDLE)]
    wf.add(wf_fan_in, after=middle)
    results = wf.enqueue()
    total = MIDDLE + 2
    wait_until(lambda: status_counts() == {"SUCCESSFUL": total}, timeout=600, message=status_counts)
    fan_in = results[-1]
    fan_in.refresh()
    # By the ledger: when the fan-in started, every parent had committed its row.
    assert fan_in.return_value == MIDDLE
    assert scalar("SELECT count(DISTINCT job_id) FROM taskapp_ledger") == total
    assert edge_violations() == 0
    assert scalar("SELECT count(DISTINCT worker_ids->>-1) FROM shardq_job") == 3, "all three workers ran jobs"
    latencies = finish_to_start_ms()
    assert len(latencies) == MIDDLE + 1
    ready = finish_to_ready_ms()
    fan_in_ms = latencies_of_child(int(fan_in.id))
    # The middle jobs' start includes waiting behind each other for a
    # thread (they all become READY at once); finish -> READY is the resolver's part.
    print(
        f"\n[workflows] 1 -> {MIDDLE} -> 1 over 3 workers: finish->start p50 {percentile(latencies, 50):.1f} ms, "
        f"p99 {percentile(latencies, 99):.1f} ms; finish->READY p50 {percentile(ready, 50):.1f} ms, "
        f"p99 {percentile(ready, 99):.1f} ms; fan-in started {fan_in_ms:.1f} ms after its last parent; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    # Woken by the ack, not by a poll (the poll is 1 s).
    assert percentile(ready, 50) < 1000


def test_a_chain_child_starts_soon_after_its_parent_finishes(workers):
    """A chain of 60 steps over 3 workers: nothing queues, so finish ->
    start is the resolver's wake-up, its statement, the NOTIFY and the claim."""
    for _ in range(3):
        workers.start("--concurrency", "2")
    wf = Workflow(name="chain")
    step = wf.add(wf_node, "s0", read_parents=False)
    for i in range(1, CHAIN):
        step = wf.add(wf_node, f"s{i}", after=[step], read_parents=False)
    wf.enqueue()
    wait_until(lambda: status_counts() == {"SUCCESSFUL": CHAIN}, timeout=300, message=status_counts)
    assert edge_violations() == 0
    latencies = finish_to_start_ms()
    print(
        f"\n[workflows] chain of {CHAIN} over 3 workers: finish->start p50 {percentile(latencies, 50):.1f} ms, "
        f"p99 {percentile(latencies, 99):.1f} ms, max {latencies[-1]:.1f} ms; load {os.getloadavg()[0]:.1f}"
    )
    # Woken by the ack: a poll alone (every second) would make this about 500 ms.
    assert percentile(latencies, 50) < 250


CHAIN = 60


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values)) - 1))]


def finish_to_ready_ms() -> list[float]:
    """For each child: when it became READY (its run_after) minus its last parent's finish (ms)."""
    rows = query(
        """
        SELECT extract(epoch FROM c.run_after - max(p.finished_at)) * 1000
        FROM shardq_edge AS e
        JOIN shardq_job AS p ON p.id = e.parent JOIN shardq_job AS c ON c.id = e.child
        GROUP BY c.id, c.run_after
        """
    )
    return sorted(float(r[0]) for r in rows)


def latencies_of_child(child: int) -> float:
    return float(
        scalar(
            """SELECT extract(epoch FROM c.last_attempted_at - max(p.finished_at)) * 1000
               FROM shardq_edge AS e JOIN shardq_job AS p ON p.id = e.parent JOIN shardq_job AS c ON c.id = e.child
               WHERE c.id = %s GROUP BY c.id, c.last_attempted_at""",
            [child],
        )
    )
