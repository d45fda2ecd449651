"""``shardq_worker`` flags whose effect is behaviour: real worker processes."""

import subprocess

from django.db import connection

import shardq
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import query, scalar, status_counts, worker_id_of, worker_stats


def test_max_tasks_exits_0_after_finishing_exactly_that_many_jobs(workers):
    shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(300)])
    proc = workers.start("--max-tasks", "120", "--concurrency", "4")
    worker = worker_id_of(proc.pid)
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not stop after --max-tasks 120:\n{workers.log(proc)}") from None
    assert code == 0, workers.log(proc)
    # Every job it claimed but did not finish was handed back: READY, not lost.
    assert status_counts() == {"SUCCESSFUL": 120, "READY": 180}
    stats = worker_stats(worker)
    assert stats["succeeded"] == 120, stats
    assert scalar("SELECT state FROM shardq_worker WHERE id = %s", [worker]) == "STOPPED"
    assert "(--max-tasks 120): stopping" in workers.log(proc)


def test_max_tasks_with_processes_counts_per_process_and_the_supervisor_exits_0(workers):
    # Each child stops after its own N; a child that stopped cleanly is not
    # replaced, so the supervisor exits 0 once both did: 2 x 25 jobs.
    shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(100)])
    proc = workers.start("--processes", "2", "--max-tasks", "25")
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the supervisor did not stop:\n{workers.log(proc)}") from None
    assert code == 0, workers.log(proc)
    assert status_counts() == {"SUCCESSFUL": 50, "READY": 50}
    assert workers.log(proc).count("(--max-tasks 25): stopping") == 2


def test_exclude_queues_runs_every_other_queue_only(workers):
    # QUEUES of the test settings: default, emails, reports (tasks.add is "reports").
    reports = shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(20)])
    emails = shardq.enqueue_many(tasks.add.using(queue_name="emails"), [((i, 2), {}) for i in range(20)])
    defaults = shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(20)])
    proc = workers.start("--exclude-queues", "reports", "--concurrency", "4")
    wait_until(
        lambda: status_counts().get("SUCCESSFUL", 0) >= 40,
        timeout=60,
        message=f"the emails and default jobs to run (now {status_counts()})",
    )
    # A poll or two more: the excluded queue's jobs are due and their shards held.
    worker = worker_id_of(proc.pid)
    wait_until(lambda: worker_stats(worker).get("heartbeats", 0) >= 3, timeout=30, message="three heartbeats")
    by_queue = dict(query("SELECT queue_name || ':' || status, count(*) FROM shardq_job GROUP BY 1"))
    assert by_queue == {"emails:SUCCESSFUL": 20, "default:SUCCESSFUL": 20, "reports:READY": 20}
    assert len(reports) == len(emails) == len(defaults) == 20
    assert "queues all but reports" in workers.log(proc)


def test_a_worker_claims_only_the_jobs_of_its_backend_alias(workers):
    # Item 9: a job stored by another TASKS alias is not this worker's to run
    # (no flag: the worker serves the alias "default").
    shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(10)])
    others = shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(10)])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE shardq_job SET backend = 'elsewhere' WHERE id = ANY(%s)", [[int(r.id) for r in others]])
    proc = workers.start()
    wait_until(
        lambda: status_counts().get("SUCCESSFUL", 0) >= 10,
        timeout=60,
        message=f"this alias's jobs to run (now {status_counts()})",
    )
    worker = worker_id_of(proc.pid)
    wait_until(lambda: worker_stats(worker).get("heartbeats", 0) >= 3, timeout=30, message="three heartbeats")
    assert dict(query("SELECT backend || ':' || status, count(*) FROM shardq_job GROUP BY 1")) == {
        "default:SUCCESSFUL": 10,
        "elsewhere:READY": 10,
    }


def test_worker_id_is_stored_with_the_incarnation_and_shown_in_its_logs(workers):
    proc = workers.start("--backend", "default", "--worker-id", "billing-1")
    worker = worker_id_of(proc.pid)
    assert scalar("SELECT name FROM shardq_worker WHERE id = %s", [worker]) == "billing-1"
    wait_until(
        lambda: f"worker billing-1 ({worker}) started" in workers.log(proc),
        timeout=30,
        message="the start line naming the worker",
    )
