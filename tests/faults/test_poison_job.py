"""Fault 7: a poison job that SIGKILLs its own worker on every attempt runs
again after each lost worker (at-least-once, whatever its max_attempts) and is
dead-lettered once it has cost SHARDQ["MAX_WORKER_LOSSES"] (3) workers; a
task with on_worker_lost="fail" never runs twice."""

import json

from tests.faults.harness import check_invariants, figures
from tests.helpers import wait_until
from tests.taskapp import fault_tasks
from tests.workers import query, scalar


def job_state(job_id: int):
    status, attempts, errors = query("SELECT status, attempts, errors FROM shardq_job WHERE id = %s", [job_id])[0]
    return status, attempts, json.loads(errors) if isinstance(errors, str) else errors


def executions_of(job_id: int) -> list[tuple]:
    return query("SELECT attempt, fence, worker FROM taskapp_execution WHERE job_id = %s ORDER BY attempt", [job_id])


def test_a_poison_job_runs_max_worker_losses_times_then_is_dead_lettered(workers):
    # A supervisor restarts each killed child; the other child takes the
    # killed one's shards over after the lease TTL and rescues the job.
    supervisor = workers.start("--processes", "2", "--concurrency", "2")
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 64,
        timeout=60,
        message="the two children to own every shard",
    )
    once = fault_tasks.poison_once.enqueue()
    wait_until(
        lambda: job_state(int(once.id))[0] == "FAILED",
        timeout=60,
        interval=0.2,
        message="the on_worker_lost='fail' poison job to be failed",
    )
    poison = fault_tasks.poison.enqueue()
    wait_until(
        lambda: job_state(int(poison.id))[0] == "FAILED",
        timeout=120,
        interval=0.2,
        message="the poison job to be dead-lettered",
    )

    status, attempts, errors = job_state(int(poison.id))
    runs = executions_of(int(poison.id))
    assert (status, attempts) == ("FAILED", 3)
    assert [attempt for attempt, _, _ in runs] == [1, 2, 3], runs
    assert len({worker for _, _, worker in runs}) == 3, "each attempt killed a different incarnation"
    assert errors[-1]["exception_class_path"] == "shardq.exceptions.WorkerLost"
    assert "lost 3 workers" in errors[-1]["traceback"]

    status, attempts, errors = job_state(int(once.id))
    assert (status, attempts) == ("FAILED", 1)
    assert len(executions_of(int(once.id))) == 1, "on_worker_lost='fail' ran twice"
    assert "on_worker_lost='fail'" in errors[-1]["traceback"]

    assert supervisor.poll() is None, "the supervisor keeps running"
    report = check_invariants(query, expected_jobs=2)
    figures(
        "poison_job",
        poison_runs=len(runs),
        once_runs=1,
        worker_incarnations=scalar("SELECT count(*) FROM shardq_worker"),
        rescued=report["rescued"],
    )
