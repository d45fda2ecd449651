"""Suspended durable jobs cost the claim nothing: they are in no index it walks."""

import pytest
from django.db import connection

from shardq.db.queries import QUERIES
from tests.helpers import scalar
from tests.integration.test_claim_plan import backlog, claim_cost, claim_params, ready_backlog  # noqa: F401

pytestmark = pytest.mark.django_db

# The 100,000 suspended jobs (the insert takes a few seconds).
SUSPENDED_ROWS = 100_000


def test_suspended_jobs_cost_the_claim_nothing(backlog):  # noqa: F811
    params = claim_params(backlog)
    claim_cost(params)  # the first run sets the new rows' hint bits
    shape_before, buffers_before = claim_cost(params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM shardq_job")
        last_ready = cursor.fetchone()[0]
        # Suspended jobs on every held shard, at the top priority, due long
        # ago: were they in the claim's index they would be claimed first.
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT 'tests.taskapp.durable_tasks.approver', 'default', 'default', 100,
                   clock_timestamp() - interval '1 day', g %% 64, g, NULL, false, 'SUSPENDED', 3, 1, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp()
            FROM generate_series(1, %s) AS g
            """,
            [SUSPENDED_ROWS],
        )
        cursor.execute("ANALYZE shardq_job")
    claim_cost(params)
    shape_after, buffers_after = claim_cost(params)
    assert shape_after == shape_before
    assert "shardq_job_ready_idx" in {row[1] for row in shape_after}
    assert buffers_after <= 1.05 * buffers_before + 10, (buffers_before, buffers_after)
    print(
        f"\n[durable] claim with {SUSPENDED_ROWS} SUSPENDED rows: its walk read {buffers_after} pages, "
        f"without them {buffers_before}"
    )
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["claim_jobs"], params)
        ids = [row[0] for row in cursor.fetchall()]
    assert ids and max(ids) <= last_ready


def test_the_waker_finds_due_suspended_jobs_through_its_index(backlog):  # noqa: F811
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT 'tests.taskapp.durable_tasks.napper', 'default', 'default', 0,
                   clock_timestamp() + make_interval(secs => g), g %% 64, g, NULL, false, 'SUSPENDED', 3, 1, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp()
            FROM generate_series(1, %s) AS g
            """,
            [20000],
        )
        cursor.execute("ANALYZE shardq_job")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + QUERIES["wake_due_jobs"],
            {"shards": list(range(64)), "batch": 500, "now": None},
        )
        text = str(cursor.fetchone()[0])
    assert "shardq_job_suspended_idx" in text


def test_the_wakers_pass_reads_a_few_index_pages_per_shard_not_every_suspended_job():
    # wake_due_jobs and seconds_until_wake run every second in each worker:
    # beside 20,000 sleeping jobs they must not read them all (each did: a
    # volatile clock as a filter, a min() over shard = ANY; about 0.3 s
    # apiece at 100,000 on this machine, bench/durable.py).
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT 'tests.taskapp.durable_tasks.napper', 'default', 'default', 0,
                   clock_timestamp() + make_interval(secs => 60 + g), g %% 64, g, NULL, false, 'SUSPENDED', 3, 1, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp()
            FROM generate_series(1, %s) AS g
            """,
            [20000],
        )
        cursor.execute("ANALYZE shardq_job")
        params = {"shards": list(range(64)), "now": None, "batch": 500}
        pages = {}
        for name in ("wake_due_jobs", "seconds_until_wake"):
            # Twice: the first run sets the new rows' hint bits (and marks the
            # index entries of rows an earlier test rolled back dead).
            for _ in range(2):
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name], params)
                plan = cursor.fetchone()[0][0]["Plan"]
            pages[name] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        cursor.execute(QUERIES["seconds_until_wake"], params)
        seconds = cursor.fetchone()[0]
    print(f"\n[durable] the waker's pass beside 20,000 sleeping jobs: pages read {pages}")
    # A few index pages per held shard (plus dead entries an earlier test left), not 20,000 entries.
    assert all(n < 2000 for n in pages.values()), pages
    assert 55 < seconds < 65  # the first one falls due in 61 s
    assert scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUSPENDED'") == 20000  # none woke
