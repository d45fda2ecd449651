"""The randomized failure-domain run (issue 10): healthy jobs mixed with
poison rows, unstorable and oversized outcomes, BaseExceptions, spoofed
NOTIFYs and bad enqueue inputs, over 3 real workers, with SIGKILL and
process-group SIGTERM churn. CI size here; `make faults` runs the full size
(SHARDQ_FULL_FAULTS=1). The five invariants are checked in SQL at the end and
the figures printed as a `[faults]` line (docs/reliability.md)."""

import os
import random
import signal
import time

import pytest
from django.tasks.exceptions import InvalidTask

import shardq
from tests.faults.harness import figures, size
from tests.helpers import wait_until
from tests.taskapp import fault_tasks
from tests.taskapp import isolation_tasks as t
from tests.workers import query, scalar

SEED = int(os.environ.get("SHARDQ_RANDOM_SEED", "10"))
WORKERS = 3
HEALTHY = size(600, 6000)
JOB_SECONDS = size(0.02, 0.01)
CHURN_EVENTS = size(6, 30)
CHURN_EVERY = size(1.5, 1.5)

POISON_ASSIGNMENTS = [
    ("errors = '{}'", "errors"),
    ("errors = 'null'", "errors"),
    ("attempts = 2147483647", "attempts"),
    ("status_rank = 2147483647", "status_rank"),
    ("run_after = '-infinity'", "run_after"),
    ("kwargs = '[]'", "kwargs"),
    ("worker_ids = '{}'", "worker_ids"),
]
BAD_OUTCOMES = [
    (t.returns, "nul", "NUL"),
    (t.returns, "surrogate", "surrogate"),
    (t.returns, "huge", "MAX_RESULT_BYTES"),
    (t.raises, "nul", "ValueError"),
    (t.raises, "surrogate", "ValueError"),
    (t.raises, "keyboard", "KeyboardInterrupt"),
    (t.raises, "cancelled", "CancelledError"),
    (t.raises, "exit", "SystemExit"),
]
BAD_INPUTS = [((object(),), {}), ((), {"n": float("nan")}), ((), {"n": {1, 2}})]


def enqueue_poison_row(rng) -> tuple[int, str]:
    from datetime import UTC, datetime, timedelta

    assignment, column = rng.choice(POISON_ASSIGNMENTS)
    [result] = shardq.enqueue_many(
        fault_tasks.acked.using(run_after=datetime.now(UTC) + timedelta(days=1)), [((), {"n": -1})]
    )
    query(f"UPDATE shardq_job SET {assignment} WHERE id = %s", [int(result.id)])
    if "run_after" not in assignment:
        query("UPDATE shardq_job SET run_after = now() WHERE id = %s", [int(result.id)])
    return int(result.id), column


@pytest.mark.timeout(900)
def test_randomized_failure_domains_hold_all_five_invariants(workers):
    rng = random.Random(SEED)
    procs = [workers.start("--concurrency", "2") for _ in range(WORKERS)]
    wait_until(lambda: scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 64, timeout=60)

    healthy = [
        int(r.id)
        for r in shardq.enqueue_many(
            fault_tasks.tx_ledger, [((), {"n": i, "sleep": JOB_SECONDS}) for i in range(HEALTHY)]
        )
    ]
    poison: dict[int, str] = {}
    bad_outcomes: dict[int, str] = {}
    refused_inputs = 0
    killed: set[int] = set()  # pids the test stopped itself
    kills = group_terms = spoofs = 0
    for _ in range(CHURN_EVENTS):
        time.sleep(CHURN_EVERY)  # fault pacing: churn spread over the run
        # Poison and misbehaving jobs arrive while workers come and go.
        for _ in range(2):
            job_id, column = enqueue_poison_row(rng)
            poison[job_id] = column
        task, kind, expected = rng.choice(BAD_OUTCOMES)
        bad_outcomes[int(task.enqueue(kind).id)] = expected
        args, kwargs = rng.choice(BAD_INPUTS)
        with pytest.raises(InvalidTask):
            t.started.enqueue(*args, **kwargs)
        refused_inputs += 1
        for payload in ("²", "-1", "x" * 50):
            query("SELECT pg_notify('shardq', %s)", [payload])
        query("SELECT pg_notify('shardq_lease', 'spoof') FROM generate_series(1, 200)")
        spoofs += 203
        # Churn: SIGKILL one worker or SIGTERM its whole process group, then
        # start a replacement.
        victim_index = rng.randrange(WORKERS)
        victim = procs[victim_index]
        killed.add(victim.pid)
        if rng.random() < 0.5:
            victim.send_signal(signal.SIGKILL)
            kills += 1
        else:
            os.killpg(victim.pid, signal.SIGTERM)
            group_terms += 1
        try:
            code = victim.wait(timeout=60)
        except Exception:
            victim.kill()
            code = victim.wait(timeout=10)
        if code not in (0, -signal.SIGKILL):
            pytest.fail(
                f"worker {victim.pid} exited {code} on {('SIGKILL', 'SIGTERM')[code == 0]}: "
                f"{workers.log(victim)[-3000:]}"
            )
        procs[victim_index] = workers.start("--concurrency", "2")

    total = len(healthy) + len(poison) + len(bad_outcomes)
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_job WHERE status IN ('SUCCESSFUL', 'FAILED')") >= total,
        timeout=size(240, 900),
        interval=0.5,
        message=lambda: f"{total} jobs to finish: {dict(query('SELECT status, count(*) FROM shardq_job GROUP BY 1'))}",
    )

    # 1. Every healthy job SUCCESSFUL, committed exactly once by its own ledger.
    statuses = dict(query("SELECT status, count(*) FROM shardq_job WHERE id = ANY(%s) GROUP BY 1", [healthy]))
    assert statuses == {"SUCCESSFUL": len(healthy)}, statuses
    ledger = dict(query("SELECT job_id, count(*) FROM taskapp_faultledger GROUP BY 1"))
    assert {job_id: ledger.get(job_id, 0) for job_id in healthy} == dict.fromkeys(healthy, 1)
    # 2. Every poison job FAILED with an error that names it.
    for job_id, status, errors in query(
        "SELECT id, status, errors::text FROM shardq_job WHERE id = ANY(%s)", [list(poison)]
    ):
        assert status == "FAILED" and "UnreadableJob" in errors and poison[job_id] in errors, (job_id, errors)
    for job_id, status, errors in query(
        "SELECT id, status, errors::text FROM shardq_job WHERE id = ANY(%s)", [list(bad_outcomes)]
    ):
        assert status == "FAILED" and bad_outcomes[job_id] in errors, (job_id, errors[-500:])
    # 3. No worker exited except the ones the test stopped.
    for proc in procs:
        assert proc.poll() is None, f"worker {proc.pid} exited {proc.returncode}: {workers.log(proc)[-3000:]}"
    # 4. No job FAILED without having started (poison rows excepted, and jobs
    #    out of their worker-loss budget).
    unstarted = query(
        "SELECT id FROM shardq_job WHERE status = 'FAILED' AND attempts = 0 AND NOT id = ANY(%s) "
        "AND errors::text NOT LIKE '%%WorkerLost%%'",
        [list(poison)],
    )
    assert unstarted == [], unstarted
    # 5. attempts == len(worker_ids) == starts in the execution log. A SIGKILL
    #    can land between a start write and the task's first line (its log
    #    insert): such an attempt started but logged nothing, and it is
    #    always one the job lost a worker in.
    mismatched = query(
        "SELECT j.id, j.attempts, jsonb_array_length(j.worker_ids), count(e.id) FROM shardq_job j "
        "LEFT JOIN taskapp_execution e ON e.job_id = j.id WHERE j.id = ANY(%s) GROUP BY j.id "
        "HAVING j.attempts <> jsonb_array_length(j.worker_ids) "
        "OR j.attempts - count(e.id) NOT BETWEEN 0 AND j.worker_losses",
        [healthy],
    )
    assert mismatched == [], f"(id, attempts, len(worker_ids), starts): {mismatched[:20]}"
    losses = scalar("SELECT count(*) FROM shardq_job WHERE worker_losses > 0")
    reruns = scalar("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND attempts > 1", [healthy])
    figures(
        "randomized",
        healthy=len(healthy),
        poison=len(poison),
        bad_outcomes=len(bad_outcomes),
        refused_inputs=refused_inputs,
        spoofed_notifies=spoofs,
        sigkills=kills,
        group_sigterms=group_terms,
        jobs_with_worker_losses=losses,
        healthy_run_twice=reruns,
        invariant_1=f"{statuses.get('SUCCESSFUL', 0)}/{len(healthy)} once",
        invariant_5_mismatches=len(mismatched),
    )
