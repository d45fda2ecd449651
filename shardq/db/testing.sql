-- The statements of shardq.testing (drain, enqueued, assert_enqueued): run on the test's own Django
-- connection, inside its transaction. Same format as queries.sql (shardq/db/queries.py loads both).
-- No lease, fence check or limit is involved: drain runs jobs in the test's process, alone.

-- name: drain_candidates
-- The READY jobs drain may run (a WHERE fragment, included bare): of the queues :queues and task
-- paths :task_paths (NULL: any), due by :until (NULL: whatever their run_after).
status = 'READY'
    AND (%(queues)s::text[] IS NULL OR queue_name = ANY(%(queues)s::text[]))
    AND (%(task_paths)s::text[] IS NULL OR task_path = ANY(%(task_paths)s::text[]))
    AND (%(until)s::timestamptz IS NULL OR run_after <= %(until)s::timestamptz)

-- name: drain_order
-- The order drain runs jobs in (an ORDER BY list, included bare): as if time moved on to each
-- job's run_after, so the jobs due now go first by priority (a worker's claim order: priority,
-- run_after, id), then the later ones in the order they fall due. One "now" for the whole
-- statement (statement_timestamp(), not clock_timestamp(), which differs from row to row).
GREATEST(run_after, statement_timestamp()), priority DESC, run_after, id

-- name: drain_start_job
-- Start the next job drain runs, as a worker's start write does: RUNNING, status_rank + 1, the
-- attempt counted, started_at (first start), last_attempted_at and :worker in worker_ids. Returns
-- what running it needs (none: nothing left to run).
WITH picked AS MATERIALIZED (
    SELECT id FROM shardq_job
    WHERE {{drain_candidates*}}
    ORDER BY {{drain_order*}}
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE shardq_job AS job
SET status = 'RUNNING', status_rank = LEAST(job.status_rank, 2147483646) + 1, attempts = job.attempts + 1,
    started_at = COALESCE(job.started_at, clock_timestamp()), last_attempted_at = clock_timestamp(),
    worker_ids = CASE WHEN jsonb_typeof(job.worker_ids) = 'array' THEN job.worker_ids ELSE '[]'::jsonb END
                 || jsonb_build_array(%(worker)s::text)
FROM picked
WHERE job.id = picked.id
RETURNING job.id, job.task_path, job.backend, job.queue_name, job.shard, job.args, job.kwargs, job.attempts,
    job.max_attempts, job.fence, job.status_rank, job.enqueued_at, job.started_at, job.last_attempted_at,
    job.worker_ids, job.errors;

-- name: drain_has_candidate
-- Whether a job drain may run is left (asked once drain has run its max_jobs).
SELECT EXISTS (SELECT 1 FROM shardq_job WHERE {{drain_candidates*}});

-- name: drain_finish_job
-- Write the outcome of the attempt drain started at rank :rank - 1 (as complete_jobs does: status,
-- rank, return value, the error appended; a retry is READY again after :delay seconds). Nothing is
-- written when the job moved on meanwhile (the task cancelled it, or committed its own outcome).
-- Returns whether it is a workflow parent whose children wait for the resolver.
UPDATE shardq_job AS job
SET status = %(status)s::text,
    status_rank = %(rank)s,
    return_value = %(return_value)s::jsonb,
    errors = CASE WHEN %(error)s::jsonb IS NULL THEN job.errors
                  WHEN jsonb_typeof(job.errors) = 'array' THEN job.errors || jsonb_build_array(%(error)s::jsonb)
                  ELSE jsonb_build_array(%(error)s::jsonb) END,
    finished_at = CASE WHEN %(status)s::text = 'READY' THEN NULL ELSE clock_timestamp() END,
    run_after = CASE WHEN %(status)s::text = 'READY'
                     THEN clock_timestamp() + make_interval(secs => %(delay)s::float8)
                     ELSE job.run_after END
WHERE job.id = %(id)s AND job.status = 'RUNNING' AND job.status_rank = %(rank)s - 1
RETURNING job.children_pending;

-- name: drain_parent_shards
-- The shards holding finished workflow parents whose children have not been moved on yet (what
-- the workers' resolvers would do next; drain then runs resolve_children over them).
SELECT DISTINCT shard FROM shardq_job
WHERE children_pending AND status IN ('SUCCESSFUL', 'FAILED');

-- name: testing_jobs
-- Jobs in :statuses of the task paths :task_paths (NULL: any), oldest first, for enqueued() and
-- the assertions' messages.
SELECT id, task_path, backend, queue_name, priority, run_after, status, args, kwargs, attempts, max_attempts,
       shard_key, enqueued_at
FROM shardq_job
WHERE status = ANY(%(statuses)s::text[])
  AND (%(task_paths)s::text[] IS NULL OR task_path = ANY(%(task_paths)s::text[]))
ORDER BY id;
