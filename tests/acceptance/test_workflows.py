"""Workflows run by several real ``shardq_worker`` processes (issue 16):
every edge respected over three workers, and the time from a parent's
finish to its child's start. One worker running a workflow, parent results
passed down and ParentFailed through a real dead-letter, runs in-process:
tests/integration/test_workflow_runs.py.

``SHARDQ_FULL_WORKFLOWS=1`` (``make workflows``) runs the fan-out/fan-in at
the issue's size, 1 -> 9,998 -> 1; ``make test`` runs 1 -> 998 -> 1."""

import os

from shardq import Workflow
from tests.helpers import edge_violations, wait_until
from tests.taskapp.tasks import wf_fan_in, wf_node
from tests.workers import query, scalar, status_counts

FULL = bool(os.environ.get("SHARDQ_FULL_WORKFLOWS"))
MIDDLE = 9_998 if FULL else 998


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
