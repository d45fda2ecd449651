-- shardq_job_step: what durable jobs recorded (steps, cursors, sleeps, waits; shardq/durable.py),
-- and the durable transitions of shardq_job this feature owns: a hand-back at a boundary, a
-- suspension, a wake. Named blocks, loaded by shardq/db/queries.py (its docstring says how they
-- are written). Every write of an attempt is fenced as an ack is (complete_job_in_transaction):
-- the job is RUNNING under a fence no newer than the attempt's and a rank below the attempt's,
-- and that fence is still its shard's claim version, locked FOR SHARE until COMMIT so no takeover
-- commits in between. Zero rows: the attempt lost the job (FenceLost), nothing of it is written.

-- name: attempt_holds
-- The fence of a durable write (a CTE body): one row when attempt (:id, :fence, :rank, :shard)
-- still owns its job, its shard's lease row locked FOR SHARE until COMMIT; none when it lost it.
-- A worker paused between this and its COMMIT must not hold the shard row
-- for ever (a takeover would wait on it): the server ends such a session
-- after :idle_ms, and the uncommitted batch is rolled back with it.
SELECT s.claim_version,
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true) AS idle_ms
FROM shardq_shard AS s
JOIN shardq_job AS j ON j.id = %(id)s
WHERE s.shard = %(shard)s AND s.claim_version = %(fence)s
  AND j.fence <= %(fence)s AND j.status_rank < %(rank)s AND j.status = 'RUNNING'
FOR SHARE OF s

-- name: load_steps
-- Everything job :id recorded, by name, and whether each row's until has passed (database time).
SELECT name, kind, output, batches, total, done, until,
       COALESCE(until <= clock_timestamp(), false) AS due
FROM shardq_job_step WHERE job_id = %(id)s;

-- name: record_step
-- Record (or, for a wait that ended, update) one row of job :id under the attempt's fence:
-- :kind, :output (JSON), :done; until = :until, or now + :seconds, or NULL (kept as it was on an
-- update: a wait's timeout counts from its first call). Returns until and whether it has passed;
-- no row: the attempt lost the job.
WITH guard AS MATERIALIZED ({{attempt_holds*}})
INSERT INTO shardq_job_step AS step (job_id, name, kind, output, fence, done, until, recorded_at, updated_at)
SELECT %(id)s, %(name)s, %(kind)s, %(output)s::jsonb, %(fence)s, %(done)s,
       COALESCE(%(until)s::timestamptz, clock_timestamp() + make_interval(secs => %(seconds)s::float8)),
       clock_timestamp(), clock_timestamp()
FROM guard
ON CONFLICT (job_id, name) DO UPDATE
SET output = excluded.output, fence = excluded.fence, done = excluded.done, updated_at = excluded.updated_at
RETURNING step.until, COALESCE(step.until <= clock_timestamp(), false) AS due;

-- name: save_cursor
-- An iteration's position after a batch (:batches 1) or at its start (:batches 0, with its
-- :total when the source can count it), under the attempt's fence, inside the batch's own
-- transaction: the batch's writes commit with it or not at all. :done once the walk has reached
-- the end. A batch committed is progress: the job's worker-loss count starts again (a job that
-- moves on between crashes is not a poison job; MAX_WORKER_LOSSES counts losses in a row).
-- Returns the batches done; no row: the attempt lost the job (the batch rolls back).
WITH guard AS MATERIALIZED ({{attempt_holds*}}),
progress AS (
    UPDATE shardq_job AS job SET worker_losses = 0
    FROM guard WHERE job.id = %(id)s AND job.worker_losses > 0 AND %(batches)s > 0
)
INSERT INTO shardq_job_step AS step (job_id, name, kind, output, fence, batches, total, done, recorded_at, updated_at)
SELECT %(id)s, %(name)s, 'iterate', %(output)s::jsonb, %(fence)s, %(batches)s, %(total)s, %(done)s,
       clock_timestamp(), clock_timestamp()
FROM guard
ON CONFLICT (job_id, name) DO UPDATE
SET output = excluded.output, fence = excluded.fence, batches = step.batches + excluded.batches,
    total = COALESCE(excluded.total, step.total), done = excluded.done, updated_at = excluded.updated_at
RETURNING step.batches;

-- name: consume_signal
-- A wait_for of job :id: under the attempt's fence, take the oldest signal :signal not consumed
-- yet, mark it consumed and record the wait (:name) done with its payload, in one statement.
-- Returns whether the attempt still holds the job, whether a signal was taken, and its payload.
WITH guard AS MATERIALIZED ({{attempt_holds*}}),
sig AS MATERIALIZED (
    SELECT g.id, g.payload FROM shardq_job_signal AS g
    WHERE g.job_id = %(id)s AND g.name = %(signal)s AND g.consumed_at IS NULL AND EXISTS (SELECT 1 FROM guard)
    ORDER BY g.id LIMIT 1
    FOR UPDATE OF g
), used AS (
    UPDATE shardq_job_signal AS g SET consumed_at = clock_timestamp()
    FROM sig WHERE g.id = sig.id
    RETURNING sig.payload
), recorded AS (
    INSERT INTO shardq_job_step AS step (job_id, name, kind, output, fence, done, recorded_at, updated_at)
    SELECT %(id)s, %(name)s, 'wait', jsonb_build_object('signal', %(signal)s::text, 'payload', used.payload),
           %(fence)s, true, clock_timestamp(), clock_timestamp()
    FROM used
    ON CONFLICT (job_id, name) DO UPDATE
    SET output = excluded.output, fence = excluded.fence, done = true, updated_at = excluded.updated_at
)
SELECT EXISTS (SELECT 1 FROM guard) AS held, (SELECT count(*) FROM used) AS taken,
       (SELECT payload FROM used) AS payload;

-- name: lock_running_job
-- The first statement of a durable transition (suspend_job, yield_job): lock job :id while this
-- attempt still owns it, so a signal racing the suspension either committed before the next
-- statement's snapshot (and is seen there) or waits for this transaction (and sees it SUSPENDED).
WITH guard AS MATERIALIZED ({{attempt_holds*}})
SELECT j.id FROM shardq_job AS j, guard WHERE j.id = %(id)s FOR UPDATE OF j;

-- name: resumed_at
-- The run_after of a durable job made READY again mid-run (handed back, woken): now; an ordered
-- job's enqueue time when earlier, so it keeps its place before its key's later jobs, which the
-- claim takes in (priority, run_after, id) order (docs/durable.md, "Ordered keys").
CASE WHEN job.ordered THEN LEAST(clock_timestamp(), job.enqueued_at) ELSE clock_timestamp() END

-- name: suspend_job
-- End attempt (:id, :fence, :rank) suspended until :until (NULL: a wait with no timeout,
-- until 9999-12-01, a time Python and the claim's job_problem can still hold; never reached):
-- SUSPENDED, off the claim index, its attempt taken back (attempts - 1 and the last worker id:
-- the segment is not an attempt, so attempts == len(worker_ids) still counts the segments that
-- ended in an outcome or run now). A signal :wait_name already sent and not consumed makes it
-- READY at once instead (a wait that lost the race with its signal). Fenced (lock_running_job ran
-- first in this transaction). Returns the new status, its shard and priority; no row: the attempt
-- lost the job.
WITH pending AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM shardq_job_signal AS g
                   WHERE g.job_id = %(id)s AND g.name = %(wait_name)s AND g.consumed_at IS NULL) AS signalled
)
UPDATE shardq_job AS job
SET status = CASE WHEN pending.signalled THEN 'READY' ELSE 'SUSPENDED' END,
    status_rank = %(rank)s,
    run_after = CASE WHEN pending.signalled THEN {{resumed_at}}
                     ELSE COALESCE(%(until)s::timestamptz, '9999-12-01 00:00:00+00') END,
    attempts = GREATEST(job.attempts - 1, 0),
    worker_ids = CASE WHEN jsonb_typeof(job.worker_ids) = 'array' AND jsonb_array_length(job.worker_ids) > 0
                      THEN job.worker_ids - (jsonb_array_length(job.worker_ids) - 1) ELSE job.worker_ids END
FROM pending, shardq_shard AS s
WHERE job.id = %(id)s AND job.fence <= %(fence)s AND job.status_rank < %(rank)s AND job.status = 'RUNNING'
  AND s.shard = job.shard AND s.claim_version = %(fence)s
RETURNING job.status, job.shard, job.priority,
          CASE WHEN job.status = 'READY' AND %(notify)s THEN pg_notify(%(channel)s, job.shard || ':' || job.priority) END;

-- name: yield_job
-- Hand attempt (:id, :fence, :rank) back READY at a boundary (shutdown, a shard handed over),
-- due now, its attempt taken back as suspend_job does; its steps and cursors stay recorded for
-- the next owner. Fenced (lock_running_job ran first). NOTIFYs its shard. Returns its id.
UPDATE shardq_job AS job
SET status = 'READY', status_rank = %(rank)s, run_after = {{resumed_at}},
    attempts = GREATEST(job.attempts - 1, 0),
    worker_ids = CASE WHEN jsonb_typeof(job.worker_ids) = 'array' AND jsonb_array_length(job.worker_ids) > 0
                      THEN job.worker_ids - (jsonb_array_length(job.worker_ids) - 1) ELSE job.worker_ids END
FROM shardq_shard AS s
WHERE job.id = %(id)s AND job.fence <= %(fence)s AND job.status_rank < %(rank)s AND job.status = 'RUNNING'
  AND s.shard = job.shard AND s.claim_version = %(fence)s
RETURNING job.id, CASE WHEN %(notify)s THEN pg_notify(%(channel)s, job.shard || ':' || job.priority) END;

-- name: wake_due_jobs
-- The waker: suspended jobs of these shards whose time has come (a sleep's end, a wait's
-- timeout) go back to READY, keeping run_after (their due time: pickup latency counts from it;
-- an ordered job's is its enqueue time if earlier, as in resumed_at),
-- status_rank + 1; through shardq_job_suspended_idx, at most :batch, SKIP LOCKED. Returns id and
-- shard of each. The time is read once (a subquery): clock_timestamp() is volatile, and compared
-- row by row it is no index condition, so every suspended job was read (bench/durable.py).
WITH due AS MATERIALIZED (
    SELECT j.id FROM shardq_job AS j
    WHERE j.shard = ANY(%(shards)s::int[]) AND j.status = 'SUSPENDED' AND j.run_after <= (SELECT {{now}})
    ORDER BY j.shard, j.run_after
    LIMIT %(batch)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE shardq_job AS job
SET status = 'READY', status_rank = LEAST(job.status_rank, 2147483646) + 1,
    run_after = CASE WHEN job.ordered THEN LEAST(job.run_after, job.enqueued_at) ELSE job.run_after END
FROM due WHERE job.id = due.id AND job.status = 'SUSPENDED'
RETURNING job.id, job.shard;

-- name: seconds_until_wake
-- Seconds until the next suspended job of these shards falls due (NULL: none; a wait with no
-- timeout, suspended until 9999-12-01, is left out). The first entry of each shard in
-- shardq_job_suspended_idx: a min() over shard = ANY(...) read every suspended job's entry
-- (100,000 of them: a third of a second, every second, beside a drain; bench/durable.py).
SELECT extract(epoch FROM min(next.run_after) - {{now}})::float8
FROM unnest(%(shards)s::int[]) AS s(shard)
CROSS JOIN LATERAL (
    SELECT j.run_after FROM shardq_job AS j
    WHERE j.shard = s.shard AND j.status = 'SUSPENDED' AND j.run_after < '9999-12-01 00:00:00+00'
    ORDER BY j.run_after
    LIMIT 1
) AS next;

-- name: admin_job_steps
-- The admin's job page: what job :id recorded, oldest first, each output cut to :chars characters
-- of JSON.
SELECT name, kind, left(output::text, %(chars)s) AS output, length(output::text) AS output_chars,
       batches, total, done, until, recorded_at, updated_at
FROM shardq_job_step WHERE job_id = %(id)s
ORDER BY recorded_at, name;

-- name: status_suspended
-- shardq_status: suspended jobs by task, with how many wait for a signal with no timeout and the
-- next time one of them wakes.
SELECT task_path, count(*), count(*) FILTER (WHERE run_after >= '9999-12-01 00:00:00+00'),
       min(run_after) FILTER (WHERE run_after < '9999-12-01 00:00:00+00')
FROM shardq_job WHERE status = 'SUSPENDED'
GROUP BY 1 ORDER BY 2 DESC, 1;

-- name: prune_orphan_steps
-- shardq_prune: the steps and signals of jobs that no longer exist (pruned, discarded, or in a
-- history partition dropped; a job in shardq_job_history keeps its records for its admin page), at most
-- :batch of each. Returns how many rows went.
WITH steps AS (
    DELETE FROM shardq_job_step AS s
    WHERE s.job_id IN (SELECT DISTINCT o.job_id FROM shardq_job_step AS o
                       WHERE NOT EXISTS (SELECT 1 FROM shardq_job AS j WHERE j.id = o.job_id)
                         AND NOT EXISTS (SELECT 1 FROM shardq_job_history AS h WHERE h.id = o.job_id)
                       LIMIT %(batch)s)
    RETURNING 1
), signals AS (
    DELETE FROM shardq_job_signal AS g
    WHERE g.job_id IN (SELECT DISTINCT o.job_id FROM shardq_job_signal AS o
                       WHERE NOT EXISTS (SELECT 1 FROM shardq_job AS j WHERE j.id = o.job_id)
                         AND NOT EXISTS (SELECT 1 FROM shardq_job_history AS h WHERE h.id = o.job_id)
                       LIMIT %(batch)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM signals);
