"""Error domains at the store boundary (DESIGN §5), against real PostgreSQL:
SQLSTATE decides the class, a refused batch is split until the bad row is
alone, and only that row's job fails."""

import uuid

import psycopg
import pytest

import shardq
from shardq.db.store import WorkerStore, ensure_shards, is_transient
from shardq.exceptions import StatementRejected
from shardq.worker.completer import Completer
from shardq.worker.fetcher import parse_notify
from shardq.worker.jobs import ClaimedJob, Outcome
from shardq.worker.listener import WakeLimiter
from tests.helpers import pipeline_factory
from tests.taskapp import isolation_tasks as t
from tests.workers import query


@pytest.fixture
def started_jobs(transactional_db):
    """20 jobs claimed and started by one worker store: (store, jobs)."""
    ensure_shards()
    worker = str(uuid.uuid4())
    store = WorkerStore(application_name="shardq-test")
    store.register_worker(worker, "test", 1, [])
    store.claim_shards(worker, 64, 30.0, 64, 3)
    shardq.enqueue_many(t.started, [((), {"n": i}) for i in range(20)])
    jobs = [ClaimedJob.from_row(row) for row in store.claim_jobs(worker, list(range(64)), None, 20, 20)]
    started, refused = store.start_jobs(worker, jobs)
    assert len(started) == 20 and refused == []
    for job in jobs:
        job.status_rank = started[job.id]["status_rank"]
    yield store, jobs
    store.close()


def outcome(job, value_json="1"):
    return Outcome(
        job.id, job.fence, job.status_rank + 1, "SUCCESSFUL", return_value_json=value_json, shard=job.shard, attempts=1
    )


def test_sqlstate_decides_the_error_class_not_the_exception_type():
    # psycopg maps 54000 "string too long" to OperationalError; sending it
    # again fails the same way, so it is never "database unavailable".
    assert issubclass(psycopg.errors.ProgramLimitExceeded, psycopg.OperationalError)
    assert not is_transient(psycopg.errors.ProgramLimitExceeded())
    assert not is_transient(psycopg.errors.UntranslatableCharacter())
    assert not is_transient(psycopg.errors.NumericValueOutOfRange())
    assert is_transient(psycopg.errors.AdminShutdown())
    assert is_transient(psycopg.errors.SerializationFailure())
    assert is_transient(psycopg.OperationalError("connection refused"))
    assert not is_transient(psycopg.DataError("timestamp too large (after year 10K)"))


def test_a_refused_batch_is_split_until_the_bad_outcome_is_alone(started_jobs):
    store, jobs = started_jobs
    batch = [outcome(job) for job in jobs]
    batch[7] = outcome(jobs[7], '"a\\u0000b"')  # jsonb refuses \u0000
    applied, refused = store.complete_jobs(batch)
    assert applied == {(o.id, o.rank) for i, o in enumerate(batch) if i != 7}
    [(bad, error)] = refused
    assert bad is batch[7] and isinstance(error, StatementRejected) and error.sqlstate.startswith("22")


def test_the_completer_fails_only_the_job_whose_outcome_postgresql_refused(started_jobs):
    store, jobs = started_jobs
    config, pipeline = pipeline_factory(store)
    completer = Completer(config, pipeline, store)
    for i, job in enumerate(jobs):
        completer.put(outcome(job, '"\\ud800"' if i == 3 else str(i)))
    completer.flush_once(block=False)
    assert completer.failure is None and completer.pending == 0
    rows = dict(query("SELECT id, status FROM shardq_job"))
    assert rows.pop(jobs[3].id) == "FAILED"
    assert set(rows.values()) == {"SUCCESSFUL"}
    [errors] = query("SELECT errors::text FROM shardq_job WHERE id = %s", [jobs[3].id])[0]
    assert "OutcomeRejected" in errors and f"job {jobs[3].id}" in errors
    assert completer.stats["outcomes_refused"] == 1


@pytest.mark.parametrize(
    "payload,notice",
    [
        # Plain shard numbers (older senders): no priority.
        ("0", (0, None)),
        ("63", (63, None)),
        ("64", None),
        ("²", None),
        ("-1", None),
        ("", None),
        (" 1", None),
        ("\u0661", None),
        ("1e3", None),
        ("9" * 100, None),
        # shard:priority, what enqueue sends.
        ("0:0", (0, 0)),
        ("63:100", (63, 100)),
        ("7:-100", (7, -100)),
        ("7:-5", (7, -5)),
        ("7:007", (7, 7)),
        ("64:5", None),
        ("7:101", None),
        ("7:-101", None),
        ("7:999", None),
        ("7:1000", None),
        ("7:", None),
        ("7:-", None),
        ("7:--5", None),
        ("7:+5", None),
        ("7: 5", None),
        ("7:5 ", None),
        ("7:5\n", None),
        ("7:²", None),
        ("7:\u0661", None),
        ("7:\uff15", None),
        ("7:5:5", None),
        ("7:5e1", None),
        ("7:0x10", None),
        (":5", None),
        ("-7:5", None),
        ("7:" + "9" * 1000, None),
        ("x" * 1000, None),
    ],
)
def test_notify_payloads_are_parsed_strictly(payload, notice):
    assert parse_notify(payload, 64) == notice


def test_a_wake_up_flood_costs_one_wake_up_per_interval_and_none_is_lost():
    now = [0.0]
    limiter = WakeLimiter(0.25, clock=lambda: now[0])
    assert limiter.ask() is True
    assert [limiter.ask() for _ in range(1000)] == [False] * 1000
    assert limiter.due() is False  # still inside the interval
    now[0] = 0.3
    assert limiter.due() is True and limiter.due() is False
