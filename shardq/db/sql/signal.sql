-- shardq_job_signal: signals sent to durable jobs (shardq.signal), kept until a wait_for consumes
-- them (shardq/durable.py). Named blocks, loaded by shardq/db/queries.py.

-- name: lock_signalled_job
-- shardq.signal's first statement, on the caller's connection: job :id's status, its row locked
-- until the caller's transaction ends (no row: no such job). Locked first so that the next
-- statement's snapshot sees a suspension that committed while this one waited for the row.
SELECT status FROM shardq_job WHERE id = %(id)s FOR UPDATE;

-- name: send_signal
-- shardq.signal's second statement: keep signal :name with :payload for job :id and, when the job
-- is SUSPENDED in a wait_for of that name (its wait recorded and not done), wake it: READY, due
-- now, status_rank + 1, its shard NOTIFYed (at commit). Returns the signal's id and whether the
-- job was woken.
WITH sent AS (
    INSERT INTO shardq_job_signal (job_id, name, payload, sent_at)
    VALUES (%(id)s, %(name)s, %(payload)s::jsonb, clock_timestamp())
    RETURNING id
), woken AS (
    UPDATE shardq_job AS job
    SET status = 'READY', status_rank = LEAST(job.status_rank, 2147483646) + 1, run_after = {{resumed_at}}
    WHERE job.id = %(id)s AND job.status = 'SUSPENDED'
      AND EXISTS (SELECT 1 FROM shardq_job_step AS w
                  WHERE w.job_id = %(id)s AND w.kind = 'wait' AND NOT w.done AND w.output ->> 'signal' = %(name)s)
    RETURNING job.shard, job.priority
)
SELECT (SELECT id FROM sent), EXISTS (SELECT 1 FROM woken),
       (SELECT count(pg_notify(%(channel)s, w.shard || ':' || w.priority)) FROM woken AS w WHERE %(notify)s);

-- name: admin_job_signals
-- The admin's job page: the signals sent to job :id, oldest first, each payload cut to :chars
-- characters of JSON.
SELECT id, name, left(payload::text, %(chars)s) AS payload, sent_at, consumed_at
FROM shardq_job_signal WHERE job_id = %(id)s ORDER BY id;
