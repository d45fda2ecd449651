-- shardq_bulk_operation and the bulk actions' own statements (shardq/bulk.py, docs/admin.md
-- "Bulk actions"). Retry, cancel and discard run the admin's and shardq.cancel's statements
-- (admin_retry_failed_jobs, cancel_jobs, admin_discard_failed_jobs) batch by batch.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: bulk_run_now
-- "Run now": the READY jobs among :ids that are not due yet (a deferred job, a retry waiting out
-- its backoff) become due now, and each one's shard is NOTIFYed as enqueue does; compare-and-set
-- on status = 'READY', so a job claimed meanwhile is left alone (a claimed job is no longer READY).
-- Returns the ids moved, with their task.
UPDATE shardq_job
SET run_after = clock_timestamp()
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'READY' AND run_after > clock_timestamp()
RETURNING id, task_path,
          CASE WHEN %(notify)s THEN pg_notify(%(channel)s, shard || ':' || least(greatest(priority, -100), 100)) END;

-- name: bulk_operation_start
-- A bulk action begins: its row, state 'running', with what it acts on (:filter, as the operator
-- gave it) and how many jobs matched when it began (:total). Returns its id.
INSERT INTO shardq_bulk_operation (action, filter, total, done, skipped, last_id, state, started_by,
                                   started_at, updated_at)
VALUES (%(action)s, %(filter)s, %(total)s, 0, 0, 0, 'running', %(by)s, clock_timestamp(), clock_timestamp())
RETURNING id;

-- name: bulk_operation_progress
-- One batch done, written in the batch's own transaction: the count and the last id walked move
-- together with the jobs, so the row is exactly what committed.
UPDATE shardq_bulk_operation
SET done = done + %(done)s, skipped = skipped + %(skipped)s, last_id = %(last_id)s,
    updated_at = clock_timestamp()
WHERE id = %(id)s;

-- name: bulk_operation_finish
-- The operation ended: 'done', or 'failed' with the error.
UPDATE shardq_bulk_operation
SET state = %(state)s, error = %(error)s, updated_at = clock_timestamp(), finished_at = clock_timestamp()
WHERE id = %(id)s;

-- name: bulk_operation_get
-- One operation for its progress page, with how long since it last moved (a 'running' one that
-- has not moved for long is shown as interrupted: its web process died).
SELECT id, action, filter, total, done, skipped, last_id, state, error, started_by, started_at,
       updated_at, finished_at, extract(epoch FROM clock_timestamp() - updated_at)::float8 AS idle_seconds
FROM shardq_bulk_operation
WHERE id = %(id)s;
