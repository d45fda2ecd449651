"""The limited claim and claim_jobs read none of each other's rows: over a
table of their own (not test_claim_plan.py's module-wide backlog), so that
the filtered-out counts are of these rows only."""

import uuid

import pytest
from django.db import connection

from shardq.db.queries import QUERIES
from tests.integration.test_claim_plan import SHARDS, claim_params, explain_analyze, filtered_out

pytestmark = pytest.mark.django_db


def test_a_backlog_of_limited_jobs_costs_the_claims_of_the_others_nothing():
    """claim_jobs walks a shard's unlimited READY jobs and the limited claim
    its limited ones, each an equality on shardq_job_ready_idx's second
    column: neither reads the other's rows (a limited backlog once made
    every claim_jobs probe filter all of it out: 11 ms a claim at 20,000)."""
    worker = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at, limit_keys)
            SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 0, clock_timestamp() - interval '1 hour',
                   g %% 64, g, NULL, false, 'READY', 0, 0, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp(),
                   -- 20,000 limited jobs, due before the 64 unlimited ones
                   CASE WHEN g <= 20000 THEN '["t:tests.taskapp.limit_tasks.three_at_once"]'::jsonb END
            FROM generate_series(1, 20064) AS g
            """,
            [],
        )
        cursor.execute("UPDATE shardq_job SET run_after = clock_timestamp() WHERE limit_keys IS NULL")
        cursor.execute("ANALYZE shardq_job")
        cursor.execute(
            "UPDATE shardq_shard SET owner = %s, claim_version = claim_version + 1,"
            " lease_expires = clock_timestamp() + interval '1 minute' WHERE shard < %s",
            [worker, SHARDS],
        )
    params = claim_params(worker, per_shard=4, limit=64)
    unlimited = explain_analyze(QUERIES["claim_jobs"], params)
    assert unlimited["Actual Rows"] == 64
    assert filtered_out(unlimited) == 0
    limited = explain_analyze(
        QUERIES["claim_limited_candidates"],
        {**params, "per_shard": 1, "scan": 64, "full": [], "queues": [], "all_queues": True},
    )
    assert limited["Actual Rows"] == 64
    assert filtered_out(limited) == 0
