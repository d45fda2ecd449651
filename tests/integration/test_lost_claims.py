"""A claim that committed but whose answer never reached the worker (the
connection died in between) leaves jobs CLAIMED (or, for the jobs the claim
started, RUNNING) under the worker's current fence; after a failed claim the
fetcher finds and hands back such jobs."""

from datetime import timedelta

import pytest
from django.utils import timezone

import shardq
from tests.helpers import in_process_worker, sql, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker():
    """A worker running in this process, holding all 64 shards."""
    with in_process_worker(concurrency=2) as worker:
        yield worker


def lost_claim(worker, args, **columns):
    """A job of ``tasks.add`` as a claim of ``worker`` whose answer was lost
    left it: status and the other ``columns`` (SQL expressions) written under
    its shard's current version (only the owner claims under it)."""
    # Due in an hour: the running worker leaves it alone until it is written.
    [result] = shardq.enqueue_many(tasks.add.using(run_after=timezone.now() + timedelta(hours=1)), [(args, {})])
    assignments = "".join(f", {name} = {expression}" for name, expression in columns.items())
    written = sql(
        "UPDATE shardq_job j SET status_rank = status_rank + 1, fence = s.claim_version, "
        f"run_after = clock_timestamp(){assignments} "
        "FROM shardq_shard s WHERE s.shard = j.shard AND j.id = %s AND j.status = 'READY' RETURNING j.status",
        [int(result.id)],
    )
    assert written == [(columns["status"].strip("'"),)], written
    worker.fetcher.claim_uncertain = True
    worker.fetcher.wake()
    wait_until(
        lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL",
        timeout=30,
        message="the lost claim's job to be handed back and run",
    )
    return result


def test_jobs_of_a_claim_whose_answer_was_lost_are_handed_back_and_run(worker):
    result = lost_claim(worker, (20, 22), status="'CLAIMED'")
    assert result.return_value == 42
    assert sql("SELECT attempts FROM shardq_job WHERE id = %s", [int(result.id)]) == [(1,)]


def test_a_lost_claim_that_started_its_job_has_the_start_taken_back_and_the_job_runs_once(worker):
    # As if a claim that started the job (claim_jobs' start) was lost:
    # RUNNING, one attempt, this worker's id.
    result = lost_claim(
        worker,
        (1, 2),
        status="'RUNNING'",
        attempts="1",
        worker_ids=f"jsonb_build_array('{worker.id}'::text)",
        started_at="clock_timestamp()",
        last_attempted_at="clock_timestamp()",
    )
    assert result.return_value == 3
    # The start that never ran was taken back: one attempt, one worker id.
    assert sql(
        "SELECT attempts, jsonb_array_length(worker_ids), worker_losses FROM shardq_job WHERE id = %s",
        [int(result.id)],
    ) == [(1, 1, 0)]


@pytest.mark.parametrize("outcome", ["SUCCESSFUL", "retry", "in_transaction"])
def test_an_attempt_whose_start_write_was_lost_has_its_outcome_refused_and_runs_again(worker, outcome):
    # A start write commits asynchronously: a failover can lose it while the
    # attempt runs, so the new primary reads the job CLAIMED under the same
    # fence. The attempt's outcome must not be recorded without its start
    # (a retry's error would count an attempt the row never had), and the
    # job must not stay CLAIMED under its live owner: it runs again.
    tasks.GATE.clear()
    try:
        # gated_flaky's first run fails (a retry outcome, due at once) once
        # the gate opens; gate's succeeds.
        # gated_in_transaction's outcome is written in the task's own
        # transaction with a ledger row (shardq.complete_in_transaction).
        task = {"SUCCESSFUL": tasks.gate, "in_transaction": tasks.gated_in_transaction}.get(outcome)
        result = tasks.gated_flaky.enqueue(f"lost-start-{worker.id}") if task is None else task.enqueue()
        job_id = int(result.id)
        wait_until(
            lambda: sql("SELECT status FROM shardq_job WHERE id = %s", [job_id]) == [("RUNNING",)],
            timeout=30,
            message="the job to be claimed and started",
        )
        lost = sql(
            "UPDATE shardq_job SET status = 'CLAIMED', status_rank = status_rank - 1, attempts = attempts - 1, "
            "started_at = NULL, last_attempted_at = NULL, worker_ids = '[]'::jsonb "
            "WHERE id = %s AND status = 'RUNNING' RETURNING id",
            [job_id],
        )
        assert lost == [(job_id,)], "the job was not RUNNING: its attempt ended before the test took its start back"
    finally:
        tasks.GATE.set()
    wait_until(
        lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL",
        timeout=30,
        message="the job whose start was lost to run again and succeed",
    )
    attempts, workers, errors = sql(
        "SELECT attempts, jsonb_array_length(worker_ids), jsonb_array_length(COALESCE(errors, '[]'::jsonb)) "
        "FROM shardq_job WHERE id = %s",
        [job_id],
    )[0]
    # Every recorded outcome belongs to a recorded start: the lost attempt's
    # outcome (and its error) is not there; the runs after it are.
    assert workers == attempts
    assert errors == attempts - 1
    assert attempts >= 1
    if outcome == "in_transaction":
        # The lost attempt's transaction (its ledger row) was refused with
        # its outcome: one ledger row, the run that counted.
        assert sql("SELECT attempt FROM taskapp_ledger WHERE job_id = %s", [job_id]) == [(attempts,)]
