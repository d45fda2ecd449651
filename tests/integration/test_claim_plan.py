"""The per-shard claim walks the partial index and never sorts the backlog."""

import json
import os
import uuid

import pytest
from django.db import connection, transaction

from shardq.db.queries import QUERIES
from shardq.db.store import claim_jobs_params, claim_scope

pytestmark = pytest.mark.django_db

SHARDS = 64
BACKLOG = 60_000


@pytest.fixture(scope="module")
def ready_backlog(django_db_setup, django_db_blocker):
    """60k READY jobs over 64 shards and two queues, written once for the
    module (committed; 2-3 s of inserting each time otherwise) and deleted
    after it. The module's tests run on one xdist worker (tests/conftest.py
    XDIST_GROUPS) and each in a transaction rolled back at its end, so what a
    test changes (its claims, the rows it adds) never reaches the next one."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(
                """
                WITH added AS (
                    INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                        key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                        args, kwargs, errors, worker_ids, enqueued_at)
                    SELECT 'tests.taskapp.tasks.noop', 'default',
                           CASE WHEN g %% 5 = 0 THEN 'emails' ELSE 'default' END,
                           (g * 7919) %% 201 - 100,
                           clock_timestamp() - make_interval(secs => g %% 3600),
                           g %% 64, g, NULL, false, 'READY', 0, 0, 0, 1,
                           '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp()
                    FROM generate_series(1, %s) AS g
                    RETURNING id)
                SELECT min(id), max(id) FROM added
                """,
                [BACKLOG],
            )
            first, last = cursor.fetchone()
        yield
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM shardq_job WHERE id BETWEEN %s AND %s", [first, last])
            cursor.execute("VACUUM ANALYZE shardq_job")


@pytest.fixture
def backlog(ready_backlog):
    """The module's 60k READY jobs, analyzed as the test begins (a test
    before it may have analyzed rows it added, then rolled them back), and
    every shard held by one worker. The test's transaction rolls back the
    lease and whatever the test does."""
    worker = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE shardq_job")
        cursor.execute(
            "UPDATE shardq_shard SET owner = %s, claim_version = claim_version + 1,"
            " lease_expires = clock_timestamp() + interval '1 minute' WHERE shard < %s",
            [worker, SHARDS],
        )
    return worker


def claim_params(worker, *, per_shard=16, limit=256) -> dict:
    # The --exclude-queues and --backend filters are on, as a worker sends them.
    return {
        **claim_scope(str(worker), list(range(SHARDS)), "*", ["default"], ["reports"], "default", per_shard),
        **claim_jobs_params(limit),
    }


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def explain(query: str, params: dict) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + query, params)
        document = cursor.fetchone()[0]
    if isinstance(document, str):
        import json

        document = json.loads(document)
    return document[0]["Plan"]


def test_the_claim_walks_the_ready_index_of_each_shard(backlog):
    plan = explain(QUERIES["claim_jobs"], claim_params(backlog))

    job_scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "shardq_job"]
    index_names = {n.get("Index Name") for n in job_scans}
    assert "shardq_job_ready_idx" in index_names, job_scans
    assert not any(n["Node Type"] == "Seq Scan" for n in job_scans), job_scans


def test_the_claim_sorts_nothing_over_the_job_table(backlog):
    plan = explain(QUERIES["claim_jobs"], claim_params(backlog))

    sorts = [n for n in plan_nodes(plan) if n["Node Type"] in {"Sort", "Incremental Sort"}]
    sorting_jobs = [sort for sort in sorts if any(n.get("Relation Name") == "shardq_job" for n in plan_nodes(sort))]
    assert sorting_jobs == []


def generic_plan(query: str, params: dict, *session: str) -> dict:
    """The plan a worker's prepared statement runs on once PostgreSQL has
    switched it to a generic plan (after five executions; forced here): the
    statement PREPAREd with its parameters as $n, EXPLAINed at EXECUTE, after
    the ``session`` statements (the claim connection's settings)."""
    import re

    names: list[str] = []

    def number(match):
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, query).replace("%%", "%")
    with connection.cursor() as cursor:
        for statement in ("SET LOCAL plan_cache_mode = force_generic_plan", *session):
            cursor.execute(statement)
        cursor.execute("PREPARE shardq_claim_generic AS " + text)
        try:
            placeholders = ", ".join(["%s"] * len(names))
            cursor.execute(
                f"EXPLAIN (FORMAT JSON) EXECUTE shardq_claim_generic({placeholders})", [params[n] for n in names]
            )
            document = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE shardq_claim_generic")
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def sorts_of_jobs(plan: dict) -> list[dict]:
    sorts = [n for n in plan_nodes(plan) if n["Node Type"] in {"Sort", "Incremental Sort"}]
    return [sort for sort in sorts if any(n.get("Relation Name") == "shardq_job" for n in plan_nodes(sort))]


def test_the_claim_on_its_generic_plan_walks_the_ready_index_on_the_claim_connection(backlog):
    """The worker's claim runs prepared, on a generic plan after five
    executions. There the planner knows no parameter (priority floor,
    look-ahead, batch) and, left to itself, read each shard's whole slice
    by a bitmap scan and sorted it, at every claim; the claim connection
    (``ordered_walks``) has no bitmap scans, so it walks the index in order."""
    plan = generic_plan(QUERIES["claim_jobs"], claim_params(backlog), QUERIES["ordered_walks"])

    job_scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "shardq_job"]
    assert "shardq_job_ready_idx" in {n.get("Index Name") for n in job_scans}, job_scans
    assert not any(n["Node Type"] in {"Seq Scan", "Bitmap Heap Scan"} for n in job_scans), job_scans
    assert sorts_of_jobs(plan) == []


def test_a_generic_claim_plan_that_reads_each_shards_slice_whole_is_caught(backlog):
    # So the test above is known to be able to fail: with no ordered index
    # walk to take (index scans off), the generic plan reads each shard's
    # slice whole and sorts it, the shape ordered_walks exists to prevent
    # (seen without it on this backlog's statistics, docs/benchmarks.md,
    # "The database's share of a job"; whether the planner picks it without
    # the setting depends on the statistics, so it is forced here).
    plan = generic_plan(QUERIES["claim_jobs"], claim_params(backlog), "SET LOCAL enable_indexscan = off")

    assert sorts_of_jobs(plan) != []
    assert any(n["Node Type"] in {"Seq Scan", "Bitmap Heap Scan"} for n in plan_nodes(plan))


def test_the_claim_connections_have_no_bitmap_scans_and_the_others_do(db):
    from shardq.db.store import WorkerStore

    claims = WorkerStore(application_name="shardq-test-claims", ordered_walks=True)
    other = WorkerStore(application_name="shardq-test-other")
    try:
        assert claims.run("show_enable_bitmapscan", {}, fetch="one")[0] == "off"
        assert other.run("show_enable_bitmapscan", {}, fetch="one")[0] == "on"
    finally:
        claims.close()
        other.close()


def test_one_global_order_by_would_sort_the_whole_backlog(backlog):
    # The design this query replaced (DESIGN §5): shown here so the two tests
    # above are known to be able to fail.
    query = """
        SELECT id FROM shardq_job
        WHERE shard = ANY(%(shards)s) AND status = 'READY' AND run_after <= clock_timestamp()
        ORDER BY priority DESC, run_after, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    """
    plan = explain(query, claim_params(backlog))

    assert any(n["Node Type"] == "Sort" for n in plan_nodes(plan))


def test_the_claim_takes_the_best_jobs_of_each_held_shard(backlog):
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["claim_jobs"], claim_params(backlog, per_shard=3, limit=1000))
        claimed = cursor.fetchall()
        columns = [c.name for c in cursor.description]
        cursor.execute(
            """
            SELECT shard, array_agg(id ORDER BY priority DESC, run_after, id)
            FROM (SELECT id, shard, priority, run_after,
                         row_number() OVER (PARTITION BY shard ORDER BY priority DESC, run_after, id) AS n
                  FROM shardq_job
                  WHERE queue_name = 'default' AND (status = 'READY' OR id = ANY(%s))) ranked
            WHERE n <= 3 GROUP BY shard
            """,
            [[row[0] for row in claimed]],  # id is the first column
        )
        expected = dict(cursor.fetchall())
        cursor.execute("SELECT shard, claim_version FROM shardq_shard WHERE shard < %s", [SHARDS])
        versions = dict(cursor.fetchall())

    claimed = [dict(zip(columns, row, strict=True)) for row in claimed]
    by_shard = {}
    for row in claimed:
        by_shard.setdefault(row["shard"], []).append(row["id"])
    assert len(claimed) == SHARDS * 3
    assert {shard: sorted(ids) for shard, ids in by_shard.items()} == {
        shard: sorted(ids) for shard, ids in expected.items()
    }
    # Each job carries its shard's claim version as its fence and rank 1; no
    # attempt is counted until it starts.
    assert all(
        row["fence"] == versions[row["shard"]]
        and row["attempts"] == 0
        and row["status_rank"] == 1
        and row["problem"] is None
        for row in claimed
    )


def test_the_claim_takes_nothing_from_shards_the_worker_does_not_hold(backlog):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL WHERE shard >= 32")
        cursor.execute(
            "UPDATE shardq_shard SET lease_expires = clock_timestamp() - interval '1 second' WHERE shard = 0"
        )
        cursor.execute(QUERIES["claim_jobs"], claim_params(backlog, per_shard=2, limit=1000))
        shard_column = [c.name for c in cursor.description].index("shard")
        shards = {row[shard_column] for row in cursor.fetchall()}

    assert shards == set(range(1, 32))


# Issue 16: WAITING workflow jobs cost the claim nothing. make test inserts
# 200k of them; SHARDQ_FULL_WORKFLOWS=1 (make workflows) the million.
WAITING_ROWS = 1_000_000 if os.environ.get("SHARDQ_FULL_WORKFLOWS") else 200_000


def claim_cost(params: dict) -> tuple[list, int]:
    """The claim's plan shape (node type, index of each scan of shardq_job)
    and the buffers it touched, run for real with EXPLAIN ANALYZE and rolled
    back (a savepoint)."""

    class Undo(Exception):
        pass

    found = {}
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["claim_jobs"], params)
                document = cursor.fetchone()[0]
            found["plan"] = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
            raise Undo
    except Undo:
        pass
    plan = found["plan"]
    scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "shardq_job" and "Scan" in n["Node Type"]]
    shape = [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows"), n.get("Actual Loops")) for n in scans]
    # Pages the walk reads: the scans of the claim's partial indexes and the
    # heap pages they fetch. Not counted: the UPDATE's probe of each picked
    # id in the primary key (its loops are in the shape), which goes one
    # level deeper once the table is big enough, whatever its rows' statuses
    # (1M finished rows cost it the same), nor the UPDATE's writes.
    walk = [n for n in scans if n.get("Index Name") != "shardq_job_pkey"]
    return shape, sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in walk)


def test_waiting_jobs_cost_the_claim_nothing(backlog):
    params = claim_params(backlog)
    claim_cost(params)  # the first run sets the new rows' hint bits
    shape_before, buffers_before = claim_cost(params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM shardq_job")
        last_ready = cursor.fetchone()[0]
        # Waiting children on every held shard, at every priority, due long ago:
        # were they in the claim's index they would be claimed first.
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at, waiting_on)
            SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 100,
                   clock_timestamp() - interval '1 day', g %% 64, g, NULL, false, 'WAITING', 0, 0, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp(), 1
            FROM generate_series(1, %s) AS g
            """,
            [WAITING_ROWS],
        )
        cursor.execute("ANALYZE shardq_job")
        cursor.execute("SELECT pg_relation_size('shardq_job_ready_idx'), count(*) FROM shardq_job")
        ready_index_bytes, rows = cursor.fetchone()
    assert rows == BACKLOG + WAITING_ROWS
    claim_cost(params)
    shape_after, buffers_after = claim_cost(params)
    # The same plan, over the same index entries, reading the same rows...
    assert shape_after == shape_before
    assert "shardq_job_ready_idx" in {row[1] for row in shape_after}
    # ... and no more pages (not one a WAITING row is on), give or take the catalog's.
    assert buffers_after <= 1.05 * buffers_before + 10, (buffers_before, buffers_after)
    print(
        f"\n[workflows] claim with {WAITING_ROWS} WAITING rows: its walk read {buffers_after} pages, without them {buffers_before}"
    )
    # The claim takes none of them, though they outrank every READY job.
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["claim_jobs"], params)
        ids = [row[0] for row in cursor.fetchall()]
        assert ids and max(ids) <= last_ready
    del ready_index_bytes


def test_the_cost_check_sees_jobs_that_are_in_the_claims_index(backlog):
    # The same rows READY instead: the claim's plan and pages change (so the
    # test above can fail).
    params = claim_params(backlog)
    shape_before, _ = claim_cost(params)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 100,
                   clock_timestamp() - interval '1 day', g %% 64, g, NULL, false, 'READY', 0, 0, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp()
            FROM generate_series(1, %s) AS g
            """,
            [20000],
        )
        cursor.execute("ANALYZE shardq_job")
    shape_after, _ = claim_cost(params)
    assert shape_after != shape_before


def filtered_out(plan: dict) -> int:
    """Rows the plan's scans of shardq_job read and threw away (EXPLAIN ANALYZE)."""
    return sum(
        n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0)
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "shardq_job"
    )


def explain_analyze(query: str, params: dict) -> dict:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params)
        document = cursor.fetchone()[0]
        transaction.set_rollback(True)  # the claim's writes, and its locks, go
    if isinstance(document, str):
        document = json.loads(document)
    return document[0]["Plan"]
