"""A claim starts no job: every job it takes is CLAIMED, no attempt used,
until its thread's start write (issue 24: started ahead is not started). A
hand-back of a job its thread had started takes the start back: the row reads
as if never claimed."""

import json

import pytest
from django.db import connection

from shardq.db.store import WorkerStore, claim_jobs_params, claim_scope, fields_row
from shardq.worker.jobs import ClaimedJob
from tests.helpers import job_factory, leased_shard_factory, sql

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shard0():
    """Shard 0 held by a fresh worker id; five READY jobs there: priorities
    50, 40, 30 (one of them ordered), 20 (delayed 0.2 s) and 10 (lost a worker
    once, last attempted an hour ago). The claims below run at the moment the
    undelayed jobs were all written (the store's injectable ``now``), so the
    delayed job is still about 0.2 s from due however long the machine took
    to get there."""
    worker, _ = leased_shard_factory([0])
    ids = {}
    for name, priority, ordered, delay, losses in [
        ("p50", 50, False, 0, 0),
        ("p40", 40, False, 0, 0),
        ("p30_ordered", 30, True, 0, 0),
        ("p20_delayed", 20, False, 0.2, 0),
        ("p10_lost", 10, False, 0, 1),
    ]:
        [ids[name]] = job_factory(
            priority=priority,
            ordered=ordered,
            delay=delay,
            worker_losses=losses,
            last_attempted_ago=3600 if losses else None,
        )
    yield worker, ids
    sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [list(ids.values())])


def claim(worker):
    store = WorkerStore(application_name="test-claim-start")
    # Once every job but the delayed one was due: the delayed one is due 0.2 s after its own write.
    [(written,)] = sql("SELECT max(run_after) FROM shardq_job WHERE run_after <= enqueued_at")
    try:
        return store, store.claim_jobs(worker, [0], None, 10, 10, lookahead=1.0, row_factory=ClaimedJob, now=written)
    except BaseException:
        store.close()
        raise


def row(job_id):
    [(status, attempts, worker_ids, started, last)] = sql(
        "SELECT status, attempts, worker_ids::text, started_at IS NOT NULL, last_attempted_at "
        "FROM shardq_job WHERE id = %s",
        [job_id],
    )
    return status, attempts, json.loads(worker_ids), started, last


def start(store, worker, jobs):
    """The start write of ``jobs`` as a thread's starter makes it, and the
    marks it leaves on each job (shardq/worker/starter.py)."""
    started, rejected = store.start_jobs(worker, jobs)
    assert rejected == [] and set(started) == {job.id for job in jobs}
    for job in jobs:
        job.started, job.previous_attempt_at = True, job.last_attempted_at
        job.status_rank = started[job.id]["status_rank"]


def test_the_claim_starts_no_job_not_even_the_due_unordered_ones(shard0):
    worker, ids = shard0
    store, jobs = claim(worker)
    store.close()
    assert {job.id for job in jobs} == set(ids.values())
    assert not any(job.started for job in jobs)
    for name in ids:
        status, attempts, worker_ids, has_started_at, _ = row(ids[name])
        assert (status, attempts, worker_ids, has_started_at) == ("CLAIMED", 0, [], False), name


def test_handing_back_a_job_its_thread_started_takes_the_start_back(shard0):
    worker, ids = shard0
    before = row(ids["p10_lost"])[4]
    # p10 ran once before (attempted an hour ago): the hand-back must
    # restore that earlier last_attempted_at.
    sql(
        "UPDATE shardq_job SET worker_losses = 0, attempts = 1, worker_ids = '[\"old\"]', "
        "started_at = last_attempted_at WHERE id = %s",
        [ids["p10_lost"]],
    )
    store, jobs = claim(worker)
    try:
        by_id = {job.id: job for job in jobs}
        start(store, worker, [by_id[ids["p10_lost"]], by_id[ids["p50"]]])
        assert row(ids["p10_lost"])[:3] == ("RUNNING", 2, ["old", worker])
        assert row(ids["p50"])[:3] == ("RUNNING", 1, [worker])
        returned = store.return_jobs(jobs)
    finally:
        store.close()
    assert returned == set(ids.values())
    assert row(ids["p50"]) == ("READY", 0, [], False, None)
    assert row(ids["p10_lost"]) == ("READY", 1, ["old"], True, before)
    assert row(ids["p30_ordered"])[:3] == ("READY", 0, [])


def test_a_hand_back_does_not_touch_a_job_that_moved_on(shard0):
    worker, _ = shard0
    store, jobs = claim(worker)
    try:
        job = jobs[0]
        start(store, worker, [job])
        # Another write moved the row on (as an ack would): the hand-back,
        # fenced on the claim's rank, must leave it alone.
        sql("UPDATE shardq_job SET status = 'SUCCESSFUL', status_rank = status_rank + 1 WHERE id = %s", [job.id])
        returned = store.return_jobs([job])
    finally:
        store.close()
    assert returned == set()
    assert row(job.id)[:3] == ("SUCCESSFUL", 1, [worker])


class _Cursor:
    def __init__(self, names):
        self.description = [type("Column", (), {"name": name})() for name in names]


def test_fields_row_builds_by_name_whatever_the_column_order():
    import dataclasses

    @dataclasses.dataclass
    class Point:
        x: int
        y: int
        label: str = "?"

    assert fields_row(Point)(_Cursor(["x", "y"]))((1, 2)) == Point(1, 2)
    assert fields_row(Point)(_Cursor(["y", "x"]))((2, 1)) == Point(1, 2)
    assert fields_row(Point)(_Cursor(["label", "x", "y"]))(("a", 1, 2)) == Point(1, 2, "a")
    with pytest.raises(TypeError, match="no field for column"):
        fields_row(Point)(_Cursor(["x", "z"]))


def test_the_claim_columns_line_up_with_claimed_job_fields(shard0):
    worker, _ = shard0
    store = WorkerStore(application_name="test-claim-start")
    try:
        cursor = store._cursor()
        from shardq.db.queries import QUERIES

        cursor.execute(
            QUERIES["claim_jobs"],
            {**claim_scope(worker, [0], "*", None, None, None, 1), **claim_jobs_params(1)},
        )
        names = [column.name for column in cursor.description]
    finally:
        store.close()
    import dataclasses

    fields = [f.name for f in dataclasses.fields(ClaimedJob)]
    assert names == fields[: len(names)], "claim_jobs RETURNING must follow ClaimedJob's field order (fast path)"


def test_the_start_write_probes_each_id_by_primary_key_not_the_inflight_index(shard0):
    """With statistics that see no CLAIMED row (the usual state after
    ANALYZE), a plain status term made the planner walk the inflight index
    and loop over the ids for every entry."""
    from shardq.db.queries import QUERIES

    worker, _ = shard0
    # A table of realistic size (20,000 READY jobs of another shard).
    sql(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at) "
        "SELECT 'tests.taskapp.tasks.noop', 'default', 'plan-test', 0, clock_timestamp(), 5, g, false, 'READY', "
        "0, 0, 0, 1, '[]', '{}', '[]', '[]', clock_timestamp() FROM generate_series(1, 20000) AS g"
    )
    try:
        sql("ANALYZE shardq_job")
        store, jobs = claim(worker)
        store.close()
        with connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (FORMAT JSON) " + QUERIES["start_jobs"],
                {
                    "worker": worker,
                    "ids": [j.id for j in jobs],
                    "fences": [j.fence for j in jobs],
                    "ranks": [j.status_rank for j in jobs],
                },
            )
            document = cursor.fetchone()[0]
    finally:
        sql("DELETE FROM shardq_job WHERE queue_name = 'plan-test'")
    plan = json.loads(document) if isinstance(document, str) else document

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = {
        n.get("Index Name")
        for n in nodes(plan[0]["Plan"])
        if n.get("Relation Name") == "shardq_job" and n["Node Type"].endswith("Scan")
    }
    assert scans == {"shardq_job_pkey"}, scans
