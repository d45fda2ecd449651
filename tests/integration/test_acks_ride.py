"""Acks ride on start writes (shardq/worker/completer.py, starter.py): the
outcomes queued for the completer are written by the next start write, in
its statement (``complete_and_start_jobs``), each part fenced as its own
statement fences it; what that statement cannot write goes back to the
completer, which writes it on its own path. Stepped stages, real
PostgreSQL: the test calls the start write itself, no executor thread runs."""

import pytest

import shardq
from shardq.worker.jobs import STARTED, Outcome
from shardq.worker.starter import UNAVAILABLE
from tests.helpers import job_row, sql
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(stepped, n):
    ids = [int(r.id) for r in shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(n)])]
    jobs = {job.id: job for job in stepped.claim(n)}
    return [jobs[i] for i in ids]


def success(job, value="3"):
    return Outcome(
        job.id, job.fence, job.status_rank + 1, "SUCCESSFUL", return_value_json=value, shard=job.shard, attempts=1
    )


def test_a_queued_outcome_is_written_by_the_next_start_write_in_its_statement(stepped):
    first, second = claimed(stepped, 2)
    starts, completer, stats = stepped.worker.executor.starts, stepped.worker.completer, stepped.worker.stats
    assert starts.start(first) == (STARTED, None)
    completer.put(success(first))
    assert job_row(first.id)["status"] == "RUNNING" and completer.holds(first.id)

    assert starts.start(second) == (STARTED, None)
    assert (job_row(first.id)["status"], job_row(first.id)["return_value"]) == ("SUCCESSFUL", 3)
    assert (job_row(second.id)["status"], job_row(second.id)["attempts"]) == ("RUNNING", 1)
    # One statement did both, committed asynchronously as the starts are:
    # the outcome lands (counted, let go) once the completer's synchronous
    # flush has made it durable.
    assert (stats["start_writes"], stats["ack_writes"], stats["succeeded"]) == (2, 0, 0)
    assert completer.holds(first.id)
    assert stepped.write() == {(first.id, first.status_rank + 1)}
    assert (stats["ack_writes"], stats["ack_flushes"], stats["acks_carried"], stats["succeeded"]) == (0, 1, 1, 1)
    assert completer.pending == 0 and not completer.holds(first.id)


def test_an_outcome_postgresql_refuses_goes_back_and_the_start_is_written_alone(stepped):
    first, second = claimed(stepped, 2)
    starts, completer, stats = stepped.worker.executor.starts, stepped.worker.completer, stepped.worker.stats
    assert starts.start(first) == (STARTED, None)
    completer.put(success(first, '"a\\u0000b"'))  # jsonb refuses \u0000

    assert starts.start(second) == (STARTED, None)
    assert job_row(second.id)["status"] == "RUNNING"
    assert job_row(first.id)["status"] == "RUNNING" and completer.holds(first.id)
    # The completer writes it on its own path: split, refused, the job failed saying why.
    stepped.write()
    row = job_row(first.id)
    assert row["status"] == "FAILED" and "OutcomeRejected" in row["errors"][-1]["exception_class_path"]
    assert (stats["outcomes_refused"], stats["acks_carried"], completer.pending) == (1, 0, 0)


def test_an_outcome_whose_fence_moved_on_is_not_written_by_the_ride_and_the_completer_counts_it(stepped):
    first, second = claimed(stepped, 2)
    starts, completer, stats = stepped.worker.executor.starts, stepped.worker.completer, stepped.worker.stats
    assert starts.start(first) == (STARTED, None)
    # Another owner took the shard over: the claim version moved on.
    sql("UPDATE shardq_shard SET claim_version = claim_version + 1000 WHERE shard = %s", [first.shard])
    completer.put(success(first))
    verdict = starts.start(second)
    assert verdict[0] == (STARTED if second.shard != first.shard else "lost")
    assert job_row(first.id)["status"] == "RUNNING", "a fenced-out outcome was written"
    stepped.write()
    assert (stats["fence_rejections"], stats["acks_carried"], completer.pending) == (1, 0, 0)
    assert job_row(first.id)["status"] == "RUNNING"


def test_a_ride_whose_answer_is_lost_hands_the_outcome_back_uncertain_and_the_completer_settles_it(stepped):
    first, second = claimed(stepped, 2)
    starts, completer, stats = stepped.worker.executor.starts, stepped.worker.completer, stepped.worker.stats
    assert starts.start(first) == (STARTED, None)
    completer.put(success(first))
    # The start write's connection dies before it is sent.
    sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = %s AND datname = current_database()",
        [starts.store.application_name],
    )
    assert starts.start(second)[0] == UNAVAILABLE
    assert job_row(second.id)["status"] == "CLAIMED"
    stepped.write()
    assert job_row(first.id)["status"] == "SUCCESSFUL"
    assert (stats["succeeded"], stats["fence_rejections"], completer.pending) == (1, 0, 0)


def test_an_outcome_that_rides_keeps_its_attempts_log_as_the_completers_own_write_does(stepped):
    first, second, third = claimed(stepped, 3)
    starts, completer = stepped.worker.executor.starts, stepped.worker.completer
    entry = '{"attempt": 1, "text": "INFO charged the card"}'
    assert starts.start(first) == (STARTED, None)
    assert starts.start(second) == (STARTED, None)
    ridden = success(first)
    ridden.log_json, ridden.log_bytes = entry, 65536
    completer.put(ridden)
    assert starts.start(third) == (STARTED, None)  # the outcome rides on this start write
    assert job_row(first.id)["status"] == "SUCCESSFUL"
    alone = success(second)
    alone.log_json, alone.log_bytes = entry, 65536
    completer.put(alone)
    stepped.write()  # written by the completer's own statement
    assert job_row(first.id)["logs"] == job_row(second.id)["logs"] == [{"attempt": 1, "text": "INFO charged the card"}]
