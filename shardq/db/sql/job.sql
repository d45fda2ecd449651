-- shardq_job: enqueue, the claim, starts, outcomes, rescue, prune, cancel, and the admin's reads of a job.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: job_columns
-- The columns a new job is written with, in order: every INSERT of a job and the bulk COPY use
-- this list (shardq/db/enqueue.py writes COPY rows in this order and checks it at import).
id, task_path, backend, queue_name, priority, run_after, shard, key_hash, shard_key, ordered, status,
    status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, limit_keys,
    key_limited, traceparent, fair_key, fair_weight, tags

-- name: insert_job
-- Insert one READY job on the caller's connection; when :notify, NOTIFY its shard and priority,
-- 'shard:priority' (delivered at commit). Its shard is key_hash & (the cluster's shard count - 1).
WITH job AS (
    INSERT INTO shardq_job {{job_columns}}
    VALUES (DEFAULT, %(task_path)s, %(backend)s, %(queue_name)s, %(priority)s,
        COALESCE(%(run_after)s::timestamptz, statement_timestamp()), %(key_hash)s & ({{shard_count_now}} - 1), %(key_hash)s,
        %(shard_key)s, %(ordered)s, 'READY', 0, 0, 0, %(max_attempts)s, %(args)s::jsonb,
        %(kwargs)s::jsonb, '[]'::jsonb, '[]'::jsonb, statement_timestamp(), %(limit_keys)s::jsonb,
        %(key_limited)s, %(traceparent)s, %(fair_key)s, %(fair_weight)s, %(tags)s::jsonb)
    RETURNING id, shard, priority, enqueued_at, run_after
)
SELECT id, enqueued_at, run_after,
       CASE WHEN %(notify)s THEN pg_notify(%(channel)s, shard || ':' || priority) END
FROM job;

-- name: insert_unique_job
-- Insert one READY job under :unique_key unless a job enqueued less than :unique_for seconds ago
-- holds the key (then insert nothing and return the holder); returns job id, inserted?, seconds
-- the key stays taken, enqueued_at, run_after.
WITH live AS MATERIALIZED (
    -- The usual duplicate: a holder this statement can see, read without a lock.
    SELECT job_id, expires_at FROM shardq_unique
    WHERE key = %(unique_key)s AND expires_at > statement_timestamp()
), new_job AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('shardq_job', 'id')) AS id
    WHERE NOT EXISTS (SELECT 1 FROM live)
), claim AS (
    -- A key row this statement cannot see yet (another transaction's, not
    -- committed) makes the INSERT wait for that transaction: it inserts if
    -- the other rolls back, lands in DO UPDATE if it commits. DO UPDATE
    -- takes an expired key over and otherwise rewrites the row unchanged, so
    -- RETURNING always names the holder, even one committed after this
    -- statement's snapshot. One timestamp for the whole statement:
    -- statement_timestamp(), also the job's enqueued_at, so a key is taken
    -- from its job's enqueued_at for exactly unique_for.
    INSERT INTO shardq_unique AS u (key, job_id, expires_at)
    SELECT %(unique_key)s, id, statement_timestamp() + make_interval(secs => %(unique_for)s)
    FROM new_job
    ON CONFLICT (key) DO UPDATE
    SET job_id = CASE WHEN u.expires_at <= statement_timestamp() THEN excluded.job_id ELSE u.job_id END,
        expires_at = CASE WHEN u.expires_at <= statement_timestamp() THEN excluded.expires_at ELSE u.expires_at END
    RETURNING u.job_id, u.expires_at
), job AS (
    INSERT INTO shardq_job {{job_columns}}
    SELECT new_job.id, %(task_path)s, %(backend)s, %(queue_name)s, %(priority)s,
        COALESCE(%(run_after)s::timestamptz, statement_timestamp()), %(key_hash)s & ({{shard_count_now}} - 1), %(key_hash)s,
        %(shard_key)s, %(ordered)s, 'READY', 0, 0, 0, %(max_attempts)s, %(args)s::jsonb,
        %(kwargs)s::jsonb, '[]'::jsonb, '[]'::jsonb, statement_timestamp(), %(limit_keys)s::jsonb,
        %(key_limited)s, %(traceparent)s, %(fair_key)s, %(fair_weight)s, %(tags)s::jsonb
    FROM new_job JOIN claim ON claim.job_id = new_job.id
    RETURNING id, shard, priority, enqueued_at, run_after
)
SELECT COALESCE(job.id, claim.job_id, live.job_id), job.id IS NOT NULL,
       extract(epoch FROM COALESCE(claim.expires_at, live.expires_at) - clock_timestamp())::float8,
       job.enqueued_at, job.run_after,
       -- Wakes the shard at commit, only when a job was inserted.
       CASE WHEN job.id IS NOT NULL AND %(notify)s THEN pg_notify(%(channel)s, job.shard || ':' || job.priority) END
FROM (VALUES (1)) AS one(x)
LEFT JOIN live ON true LEFT JOIN claim ON true LEFT JOIN job ON true;

-- name: job_traceparents
-- The stored trace context of existing jobs a workflow's new steps wait on (shardq/tracing.py
-- links each step's span to its parents'): id, traceparent.
SELECT id, traceparent FROM shardq_job WHERE id = ANY(%(ids)s::bigint[]);

-- name: get_job
-- One job by id, every column a TaskResult needs, from shardq_job or, once it moved there,
-- shardq_job_history (job_anywhere). Times Python cannot hold (±infinity, beyond year
-- 9999: rows written by hand) come back clamped to 9999-12-31 when late, NULL when early.
SELECT id, task_path, backend, queue_name, priority,
       CASE WHEN run_after > '9999-12-31+00' THEN '9999-12-31+00' WHEN run_after < '0001-01-03+00' THEN NULL ELSE run_after END AS run_after,
       status, args, kwargs, return_value, errors, worker_ids,
       CASE WHEN enqueued_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN enqueued_at < '0001-01-03+00' THEN NULL ELSE enqueued_at END AS enqueued_at,
       CASE WHEN started_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN started_at < '0001-01-03+00' THEN NULL ELSE started_at END AS started_at,
       CASE WHEN finished_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN finished_at < '0001-01-03+00' THEN NULL ELSE finished_at END AS finished_at,
       CASE WHEN last_attempted_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN last_attempted_at < '0001-01-03+00' THEN NULL ELSE last_attempted_at END AS last_attempted_at,
       attempts, max_attempts, shard, fence, status_rank
FROM {{job_anywhere}} AS job;

-- name: served_jobs
-- A worker's filter on a job row (a WHERE fragment, included bare by the claims): jobs of its
-- queues (:queues; every queue but :exclude_queues when :all_queues) stored by its backend alias
-- (:backend; any alias's when :any_backend).
(queue_name = ANY(%(queues)s::text[]) OR %(all_queues)s)
    AND NOT (queue_name = ANY(%(exclude_queues)s::text[]))
    AND (backend = %(backend)s OR %(any_backend)s)

-- name: open_gates
-- claim_jobs' filter on a job row (a WHERE fragment, included bare): not a key_limited job of a
-- key whose gate in the worker's local queue has jobs waiting already (:full_tasks and :full_keys,
-- pairwise: task path and shard key; empty arrays: none). Such a job would only wait in memory
-- too, so it keeps its place in the table and the claim goes on to other keys' jobs
-- (docs/limits.md, "Limits by the shard key"). A row with no shard key is never passed over.
-- An uncorrelated IN: one hashed set per statement, not a scan of the keys per row.
NOT COALESCE(key_limited AND (task_path, shard_key) IN (
    SELECT f.task, f.key FROM unnest(%(full_tasks)s::text[], %(full_keys)s::text[]) AS f(task, key)), false)

-- name: claim_fence_set
-- What every claim writes on each job it takes (``job``, from ``picked``: its claim_version): the
-- fence and the rank. A SET list fragment, included bare by claim_jobs, claim_limited_owned and
-- claim_start_set.
status_rank = LEAST(job.status_rank, 2147483646) + 1,
    fence = picked.claim_version

-- name: claim_start_set
-- claim_fence_set, and for a job the claim starts (``picked.start_now``: only claim_limited_jobs'
-- jobs limited by rates alone, whose token the claim spends) the attempt, the start times and this
-- worker's id. A SET list fragment, included bare by claim_limited_jobs.
{{claim_fence_set*}},
    attempts = job.attempts + picked.start_now::int,
    started_at = CASE WHEN picked.start_now THEN COALESCE(job.started_at, clock_timestamp()) ELSE job.started_at END,
    last_attempted_at = CASE WHEN picked.start_now THEN clock_timestamp() ELSE job.last_attempted_at END,
    worker_ids = CASE WHEN picked.start_now THEN job.worker_ids || jsonb_build_array(%(worker)s::text)
                      ELSE job.worker_ids END

-- name: claim_returning
-- What a claim returns of each job it took (``job``, with ``picked``: its problem, NULL for a
-- readable row, whether the claim started it, the attempt time before it), in the order of
-- ClaimedJob's fields (shardq/worker/jobs.py): the worker builds each row positionally once the
-- names are checked to match. A RETURNING list, included bare by claim_jobs, claim_limited_jobs and
-- claim_limited_owned.
job.id, job.task_path, job.queue_name, job.priority,
    CASE WHEN picked.problem IS NULL THEN extract(epoch FROM job.run_after)::float8 END AS run_after,
    job.shard, job.shard_key, job.ordered,
    job.args::text AS args_json, job.kwargs::text AS kwargs_json, job.attempts, job.max_attempts,
    job.fence, job.status_rank,
    CASE WHEN picked.problem IS NULL THEN job.enqueued_at END AS enqueued_at,
    CASE WHEN picked.problem IS NULL THEN job.started_at END AS started_at,
    CASE WHEN picked.problem IS NULL THEN job.last_attempted_at END AS last_attempted_at,
    -- As text: decoded only when a TaskResult is built (context, signals).
    job.worker_ids::text AS worker_ids_json, job.errors::text AS errors_json,
    CASE WHEN jsonb_typeof(job.errors) = 'array' THEN jsonb_array_length(job.errors) ELSE 0 END AS error_count,
    job.backend,
    -- JSON size of the arguments: enqueue refuses calls over MAX_PAYLOAD_BYTES,
    -- the executor fails rows written some other way.
    octet_length(job.args::text) + octet_length(job.kwargs::text) AS payload_bytes,
    job.worker_losses, picked.problem, picked.start_now AS started,
    CASE WHEN picked.problem IS NULL THEN picked.previous_attempt_at END AS previous_attempt_at,
    -- The limits it counts against (NULL: none), for the worker's limiter;
    -- none for a quarantined row (its value may be any JSON, decoded here).
    CASE WHEN picked.problem IS NULL THEN job.limit_keys END AS limit_keys,
    -- Limited by its own shard key: the local queue holds it to the cap.
    job.key_limited,
    -- The enqueuing span's W3C trace context (shardq/tracing.py); NULL: untraced.
    CASE WHEN picked.problem IS NULL THEN job.traceparent END AS traceparent,
    -- Its fair key and own weight (docs/fairness.md; NULL: none).
    job.fair_key, job.fair_weight

-- name: claim_held
-- claim_jobs' first step (a CTE body): the shards of :shards this worker holds in pool :pool under a
-- live lease, with their claim version, their place in the given order, whether another pool holds
-- a live lease on them too (shared), and during a reshard the shard's family.
-- No lock on the shard rows (a FOR SHARE here costs a WAL record per
-- shard per claim): a claim that races a takeover leaves its rows CLAIMED
-- under the old version, where starts and acks cannot land (both check the
-- shard's current version) and the new owner's sweep (rescue_jobs) puts
-- them back.
SELECT s.shard, s.claim_version, h.ord,
       -- Another pool's live lease on the shard: its workers may claim
       -- jobs of the same keys (the ordered-key guard, claim_key_free).
       EXISTS (SELECT 1 FROM shardq_shard AS o
               WHERE o.shard = s.shard AND o.id <> s.id AND o.owner IS NOT NULL
                 AND o.lease_expires > {{now}}) AS shared,
       -- A reshard in progress (shardq_cluster.reshard_from): a key's
       -- unfinished jobs may sit in any shard of this one's family (the
       -- shards equal to it below the old count): its old shard, its new
       -- one, or the old one again for a job placed by a transaction
       -- that began before the count switched. The ordered-key guard
       -- then looks across the family. NULL: no reshard.
       (SELECT ARRAY(SELECT (s.shard & (c.reshard_from - 1)) + k * c.reshard_from
                     FROM generate_series(0, c.shard_count / c.reshard_from - 1) AS k)
        FROM shardq_cluster AS c WHERE c.id = 1 AND c.reshard_from > 0) AS family
FROM unnest(%(shards)s::int[]) WITH ORDINALITY AS h(shard, ord)
JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = h.shard
WHERE s.owner = %(worker)s AND s.lease_expires > {{now}}

-- name: claim_walk
-- What claim_jobs' walks of a shard's slice of the ready index take (a WHERE fragment over
-- shardq_job, included bare, after the shard and priority tests): READY, due now or within
-- :lookahead seconds, no limit_keys (limited jobs are claimed by claim_limited_jobs, which takes
-- their slots and tokens: never here), the worker's queues and backend, and not behind a full
-- gate of its local queue.
status = 'READY'
  AND run_after <= {{now}} + make_interval(secs => %(lookahead)s)
  AND limit_keys IS NULL
  AND {{served_jobs*}}
  AND {{open_gates*}}

-- name: claim_tops
-- claim_jobs' second step (a CTE body over held): each held shard's best due priority, one probe
-- of its slice of the ready index (claim_walk's filters), no lock taken.
-- A claim that walked every shard for a few jobs each, as this one did
-- before, took priority-0 jobs of one shard while another shard's
-- priority-20 jobs waited in the table; the local queue can only order
-- what was claimed.
-- Two probes a shard: its jobs without a fair key and its fair ones (each a range of
-- shardq_job_ready_idx, fair_column false and true), kept apart (plain_priority, fair_priority:
-- the fair round takes the best fair level, claim_fair) and the better of the two. A shard with
-- no fair job pays one probe of an empty range.
SELECT held.shard, held.claim_version, held.ord, held.shared, held.family,
       GREATEST(plain.plain_priority, fair.fair_priority) AS priority, plain.plain_priority, fair.fair_priority
FROM held
CROSS JOIN LATERAL (
    SELECT max(t.priority) AS plain_priority FROM (
        (SELECT priority FROM shardq_job
             WHERE shard = held.shard AND priority >= %(min_priority)s AND {{claim_walk*}} AND {{fair_column}} IS FALSE
             ORDER BY priority DESC, run_after, id
             LIMIT 1)
        UNION ALL
        -- Never a row (priorities end at 100): a second branch, so that max() over the
        -- two is the planner's min/max probe of both, ordered index scans (a lone
        -- ORDER BY .. LIMIT 1 or max() of a range its statistics think empty may be
        -- planned as a bitmap scan of the range, dead entries and all, and a sort).
        (SELECT priority FROM shardq_job
             WHERE shard = held.shard AND priority >= %(min_priority)s AND {{claim_walk*}} AND {{fair_column}} IS FALSE AND priority > 100
             ORDER BY priority DESC, run_after, id
             LIMIT 1)
    ) AS t
) AS plain
CROSS JOIN LATERAL (
    SELECT max(t.priority) AS fair_priority FROM (
        (SELECT priority FROM shardq_job
             WHERE shard = held.shard AND priority >= %(min_priority)s AND {{claim_walk*}} AND {{fair_column}} IS TRUE
             ORDER BY priority DESC, run_after, id
             LIMIT 1)
        UNION ALL
        -- Never a row (priorities end at 100): a second branch, so that max() over the
        -- two is the planner's min/max probe of both, ordered index scans (a lone
        -- ORDER BY .. LIMIT 1 or max() of a range its statistics think empty may be
        -- planned as a bitmap scan of the range, dead entries and all, and a sort).
        (SELECT priority FROM shardq_job
             WHERE shard = held.shard AND priority >= %(min_priority)s AND {{claim_walk*}} AND {{fair_column}} IS TRUE AND priority > 100
             ORDER BY priority DESC, run_after, id
             LIMIT 1)
    ) AS t
) AS fair
WHERE plain.plain_priority IS NOT NULL OR fair.fair_priority IS NOT NULL

-- name: job_problem
-- What makes a job row unreadable for the worker, naming the column and its value (NULL: nothing):
-- the one check of every value a claim hands on, an expression over an unqualified shardq_job row
-- (included by claim_jobs, claim_limited_candidates and claim_limited_owned, whose UPDATE then
-- quarantines the row: FAILED with an UnreadableJob error, see claim_status_set). A row written
-- outside shardq may hold anything its column types allow; read as it is, one odd value failed
-- every job of its claim or stopped the fetcher (issue 24). The bounds are what shardq itself
-- writes and what Python can hold: ranks, attempts and losses far from the integer's end (the
-- claim, start and rescue add to them); Django's priorities; at least one attempt allowed; times
-- that are Python datetimes (years 1 to 9999, a day's margin for the session's time zone); JSON
-- of the kind each column holds, nested at most 200 deep (enqueue refuses more than 100; Python's
-- json fails near 1,000) and with no integer of more than 4300 digits (Python's int refuses it);
-- limit_keys NULL or distinct strings (a key twice would wait for its own slot). A COALESCE of
-- CASEs: each stops at its first problem, and a long argument list (no problem) does not hide the
-- columns after it. A value the worker does not read here (shard, key_hash, fence, status, queue
-- and backend names, return_value, finished_at, the workflow columns) cannot fail a claim: a row
-- whose shard, status, queue or backend is not one a claim serves is never claimed, the claim
-- writes its own fence, and the rest stays in the table.
COALESCE(
    CASE
        WHEN status_rank NOT BETWEEN 0 AND 2147483000 THEN format('status_rank %%s is out of range', status_rank)
        WHEN attempts NOT BETWEEN 0 AND 2147483000 THEN format('attempts %%s is out of range', attempts)
        WHEN worker_losses NOT BETWEEN 0 AND 2147483000 THEN format('worker_losses %%s is out of range', worker_losses)
        WHEN max_attempts < 1 THEN format('max_attempts %%s is below 1', max_attempts)
        WHEN priority NOT BETWEEN -100 AND 100 THEN format('priority %%s is outside -100..100', priority)
        WHEN run_after NOT BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'
            THEN format('run_after %%s is not a time of the years 1 to 9999', run_after)
        WHEN enqueued_at NOT BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'
            THEN format('enqueued_at %%s is not a time of the years 1 to 9999', enqueued_at)
        WHEN started_at NOT BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'
            THEN format('started_at %%s is not a time of the years 1 to 9999', started_at)
        WHEN last_attempted_at NOT BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'
            THEN format('last_attempted_at %%s is not a time of the years 1 to 9999', last_attempted_at)
        WHEN jsonb_typeof(args) IS DISTINCT FROM 'array' THEN format('args %%s is not a JSON array', left(args::text, 80))
        WHEN jsonb_typeof(kwargs) IS DISTINCT FROM 'object'
            THEN format('kwargs %%s is not a JSON object', left(kwargs::text, 80))
        WHEN jsonb_typeof(errors) IS DISTINCT FROM 'array'
            THEN format('errors %%s is not a JSON array', left(errors::text, 80))
        WHEN jsonb_typeof(worker_ids) IS DISTINCT FROM 'array'
            THEN format('worker_ids %%s is not a JSON array', left(worker_ids::text, 80))
    END,
    -- Each JSON column: one text conversion (the costly part: about 0.35 us a row, measured), not
    -- for an empty list or object (a value nested 201 deep or holding such a number takes more
    -- than 14 bytes: the smallest, [1e4300], takes 19), and only a text long enough to fail is
    -- walked.
    CASE WHEN pg_column_size(args) > 14 AND octet_length(args::text) > 400 THEN CASE
        WHEN jsonb_path_exists(args, 'strict $.**{201}') THEN 'args is nested deeper than 200 lists or objects'
        WHEN octet_length(args::text) > 4300
             AND jsonb_path_exists(args, 'strict $.** ? (@.type() == "number" && (@ >= 1e4300 || @ <= -1e4300))')
            THEN 'args holds a number of more than 4300 digits'
    END END,
    CASE WHEN pg_column_size(kwargs) > 14 AND octet_length(kwargs::text) > 400 THEN CASE
        WHEN jsonb_path_exists(kwargs, 'strict $.**{201}') THEN 'kwargs is nested deeper than 200 lists or objects'
        WHEN octet_length(kwargs::text) > 4300
             AND jsonb_path_exists(kwargs, 'strict $.** ? (@.type() == "number" && (@ >= 1e4300 || @ <= -1e4300))')
            THEN 'kwargs holds a number of more than 4300 digits'
    END END,
    CASE WHEN pg_column_size(errors) > 14 AND octet_length(errors::text) > 400 THEN CASE
        WHEN jsonb_path_exists(errors, 'strict $.**{201}') THEN 'errors is nested deeper than 200 lists or objects'
        WHEN octet_length(errors::text) > 4300
             AND jsonb_path_exists(errors, 'strict $.** ? (@.type() == "number" && (@ >= 1e4300 || @ <= -1e4300))')
            THEN 'errors holds a number of more than 4300 digits'
    END END,
    CASE WHEN pg_column_size(worker_ids) > 14 AND octet_length(worker_ids::text) > 400 THEN CASE
        WHEN jsonb_path_exists(worker_ids, 'strict $.**{201}') THEN 'worker_ids is nested deeper than 200 lists or objects'
        WHEN octet_length(worker_ids::text) > 4300
             AND jsonb_path_exists(worker_ids, 'strict $.** ? (@.type() == "number" && (@ >= 1e4300 || @ <= -1e4300))')
            THEN 'worker_ids holds a number of more than 4300 digits'
    END END,
    CASE
        WHEN limit_keys IS NULL THEN NULL  -- no limit (and no subquery below for it)
        WHEN jsonb_typeof(limit_keys) <> 'array'
            THEN format('limit_keys %%s is not a JSON array', left(limit_keys::text, 80))
        WHEN jsonb_path_exists(limit_keys, 'strict $[*] ? (@.type() != "string")')
            THEN format('limit_keys %%s holds a value that is not a string', left(limit_keys::text, 80))
        WHEN (SELECT count(DISTINCT k) <> count(*) FROM jsonb_array_elements_text(limit_keys) AS k)
            THEN format('limit_keys %%s names a limit twice', left(limit_keys::text, 80))
    END)

-- name: claim_status_set
-- What a claim writes on each job it takes besides claim_start_set: the status (FAILED for a row
-- job_problem found unreadable, RUNNING for a job the claim starts, else CLAIMED), and for an
-- unreadable row its finished_at and an UnreadableJob error naming the value, appended to its
-- errors. A SET list fragment over ``job`` and ``picked`` (problem, start_now), included bare by
-- claim_jobs, claim_limited_owned and claim_limited_jobs.
status = CASE WHEN picked.problem IS NOT NULL THEN 'FAILED'
                  WHEN picked.start_now THEN 'RUNNING' ELSE 'CLAIMED' END,
    finished_at = CASE WHEN picked.problem IS NULL THEN job.finished_at ELSE clock_timestamp() END,
    errors = CASE WHEN picked.problem IS NULL THEN job.errors
        ELSE (CASE WHEN jsonb_typeof(job.errors) = 'array' THEN job.errors ELSE '[]'::jsonb END)
             || jsonb_build_array(jsonb_build_object(
                 'exception_class_path', 'shardq.exceptions.UnreadableJob',
                 'traceback', format('shardq.exceptions.UnreadableJob: job %%s was not run: %%s '
                                     || E'(the row was written outside shardq; enqueue the task again)\n',
                                     job.id, picked.problem)))
        END

-- name: claim_key_free
-- The claim's guard for a job whose key may be in flight under another lease (a WHERE fragment
-- over shardq_job, for a shard of ``held``): true unless the job is ordered, or limited by its
-- shard key, on a shard another pool holds too or during a reshard, and a job of its key is in
-- flight under another lease or READY before it; and false for an ordered job whose key has a
-- SUSPENDED job (through shardq_job_ordered_susp_idx).
-- Several pools can claim one shard's jobs (docs/architecture.md,
-- "Pools"): where another pool holds this shard, an ordered job is
-- claimed only when no job of its key is in flight under another
-- lease, whatever its id (a retried job is READY again below its
-- key's newer jobs, and one of those may run under another pool's
-- lease), and no READY one comes before it in one total order,
-- (run_after, id), so of two that two pools' claims see at once
-- only the first passes. A READY predecessor counts as seen by this
-- statement's snapshot, so a claim racing another pool's claim of
-- that predecessor errs toward waiting. During a reshard the same
-- holds across the shard's family (see claim_held): each of its
-- shards may have its own owner.
(CASE WHEN ordered AND (held.shared OR held.family IS NOT NULL) THEN NOT EXISTS (
        SELECT 1 FROM shardq_job AS e
        WHERE e.shard = ANY(COALESCE(held.family, ARRAY[held.shard]::int[]))
          AND e.shard_key = shardq_job.shard_key AND e.ordered
          AND e.status IN ('READY', 'CLAIMED', 'RUNNING')
          AND CASE WHEN e.status = 'READY'
                   THEN (e.run_after, e.id) < (shardq_job.run_after, shardq_job.id)
                   ELSE e.fence <> held.claim_version END)
    -- A job limited by its shard key (key_limited; docs/limits.md):
    -- its owner's local queue keeps the cap, so all of a key's jobs
    -- in flight must be under one lease. Over the task's jobs of
    -- the key: none in flight under another lease, whatever its id
    -- (a retried job is READY again below newer jobs of its key
    -- that may run under another pool's lease), and none READY
    -- before it in one total order, (run_after, id): of two READY
    -- jobs that two pools' claims see at once, the later one waits.
    WHEN key_limited AND (held.shared OR held.family IS NOT NULL) THEN NOT EXISTS (
        SELECT 1 FROM shardq_job AS e
        WHERE e.shard = ANY(COALESCE(held.family, ARRAY[held.shard]::int[]))
          AND e.shard_key = shardq_job.shard_key AND e.key_limited
          AND e.task_path = shardq_job.task_path
          AND e.status IN ('READY', 'CLAIMED', 'RUNNING')
          AND CASE WHEN e.status = 'READY'
                   THEN (e.run_after, e.id) < (shardq_job.run_after, shardq_job.id)
                   ELSE e.fence <> held.claim_version END)
    ELSE true END)
    -- An ordered key whose job is suspended (a durable sleep or wait): its
    -- other jobs wait until it has finished (docs/durable.md, "Ordered keys").
    AND NOT (ordered AND EXISTS (
        SELECT 1 FROM shardq_job AS z
        WHERE z.shard = ANY(COALESCE(held.family, ARRAY[held.shard]::int[]))
          AND z.shard_key = shardq_job.shard_key AND z.ordered AND z.status = 'SUSPENDED'))

-- name: fair_column
-- shardq_job_ready_idx's third column (an expression over an unqualified shardq_job row): an
-- unlimited job with a fair key (docs/fairness.md). Walks write "{{fair_column}} IS FALSE" (every
-- job without a fair key, and every limited one) or "IS TRUE": the equality on that column.
fair_key IS NOT NULL AND limit_keys IS NULL

-- name: fair_ready
-- shardq_job_fair_idx's predicate at the fair round's level (a WHERE fragment over shardq_job,
-- with ``fair_scope`` in scope, included bare): the unlimited READY jobs with a fair key, of the
-- priority the round takes.
status = 'READY' AND fair_key IS NOT NULL AND limit_keys IS NULL AND priority = fair_scope.level

-- name: fair_scope
-- claim_jobs' step for the fair round (a CTE body over tops and runner_up; no row: no round):
-- the level it takes (the best fair priority due among the shards at or above the floor), the
-- held shards with fair jobs at that level (sorted: the walk skips to the next of them), and how
-- many jobs it may take: the whole batch, or half of it when jobs without a fair key are due at
-- the floor too (the plain walks take the rest).
SELECT l.level,
       ARRAY(SELECT tops.shard FROM tops WHERE tops.fair_priority = l.level ORDER BY tops.shard)::int[] AS shards,
       CASE WHEN EXISTS (SELECT 1 FROM tops WHERE tops.plain_priority >= l.floor)
            THEN (%(limit)s + 1) / 2 ELSE %(limit)s END AS take
FROM (SELECT max(tops.fair_priority) AS level, min(runner_up.floor) AS floor FROM tops, runner_up
      WHERE tops.fair_priority >= runner_up.floor) AS l
WHERE %(fair_walk)s AND l.level IS NOT NULL

-- name: fair_probe
-- The fair round's step (a subquery body, bare, over ``fair_scope`` and a lower bound
-- ``after``: a (key, shard) pair): the first (fair key, shard) pair after it at the round's
-- level, one probe of shardq_job_fair_idx (keys in byte order, COLLATE "C").
SELECT k.key, k.shard::int AS shard FROM (
    SELECT fair_key COLLATE "C" AS key, shard FROM shardq_job
    WHERE {{fair_ready*}} AND (fair_key COLLATE "C", shard) > (after.key, after.shard)
    -- The index's order (the shard as it is stored: a cast would be sorted).
    ORDER BY fair_key COLLATE "C", shard
    LIMIT 1
) AS k

-- name: claim_fair
-- claim_candidates' round over the fair jobs (a subquery body over fair_scope and held),
-- docs/fairness.md. A FIFO slice of each shard would be one noisy key's backlog, and a walk of
-- each shard's keys a pass over every key the shard holds (a tenant with one job on each of
-- many shards got them all in one pass); instead one walk goes over the fair keys of every
-- held shard at once: the keys after :fair_after (the last key this worker took: the keys take
-- turns across claims), then from the first key again up to it, each key once, on
-- shardq_job_fair_idx: from a key's pair (key, shard) that is not on a held shard the walk skips
-- to the key's next pair on one (the next held shard), and from a key taken or full (in
-- :full_fair_keys: as many of its jobs wait in the worker's memory as it buffers a key) to the
-- next key; until fair_scope.take keys not full were found (or four probes a key, passing over
-- at most every full one). Of each key taken, the head of its pair in claim order,
-- fair_scope.take shared out over the keys by weight (rounded up), FOR UPDATE SKIP LOCKED.
WITH RECURSIVE walk(key, shard, jump, take, wrapped, n, open) AS (
    SELECT f.key, f.shard, f.mine OR f.full, f.mine AND NOT f.full, f.wrapped, 1, (f.mine AND NOT f.full)::int
    FROM (
        SELECT p.key, p.shard, p.wrapped, p.shard = ANY(fair_scope.shards) AS mine,
               p.key = ANY(%(full_fair_keys)s::text[]) AS full
        FROM fair_scope CROSS JOIN LATERAL (
            -- The keys after the last one taken; none: from the first key.
            (SELECT q.*, false AS wrapped
             FROM (SELECT %(fair_after)s::text COLLATE "C" AS key, 32767 AS shard) AS after,
                  LATERAL ({{fair_probe*}}) AS q)
            UNION ALL
            (SELECT q.*, true
             FROM (SELECT ''::text COLLATE "C" AS key, -1 AS shard) AS after, LATERAL ({{fair_probe*}}) AS q)
            LIMIT 1
        ) AS p
    ) AS f
    UNION ALL
    SELECT f.key, f.shard, f.mine OR f.full, f.mine AND NOT f.full, f.wrapped, walk.n + 1,
           walk.open + (f.mine AND NOT f.full)::int
    FROM walk
    CROSS JOIN fair_scope
    CROSS JOIN LATERAL (
        SELECT p.key, p.shard, p.wrapped, p.shard = ANY(fair_scope.shards) AS mine,
               p.key = ANY(%(full_fair_keys)s::text[]) AS full
        FROM (
            (SELECT q.*, walk.wrapped AS wrapped
             FROM (SELECT walk.key,
                          -- Taken or full: the next key. Else this key's pair on the
                          -- next held shard (minus one: the bound is strict).
                          CASE WHEN walk.jump THEN 32767
                               ELSE COALESCE((SELECT min(h) FROM unnest(fair_scope.shards) AS h
                                              WHERE h > walk.shard) - 1, 32767) END AS shard) AS after,
                  LATERAL ({{fair_probe*}}) AS q)
            UNION ALL
            -- Past the last key: from the first key again, once.
            (SELECT q.*, true
             FROM (SELECT ''::text COLLATE "C" AS key, -1 AS shard) AS after, LATERAL ({{fair_probe*}}) AS q
             WHERE NOT walk.wrapped)
            LIMIT 1
        ) AS p
    ) AS f
    WHERE walk.open < fair_scope.take
      AND walk.n < 4 * fair_scope.take + cardinality(%(full_fair_keys)s::text[])
      -- Round again: up to the last key taken, which comes last.
      AND NOT (f.wrapped AND f.key > %(fair_after)s::text COLLATE "C")
), keys AS (
    -- Each key's weight as the worker knows it (:fair_weight_keys, :fair_weight_values: the
    -- keys it has seen whose weight is not 1) over the keys' total: its part of the batch.
    SELECT key, shard, weight / sum(weight) OVER () AS part FROM (
        SELECT walk.key, walk.shard, COALESCE(
                   (SELECT w.weight FROM unnest(%(fair_weight_keys)s::text[], %(fair_weight_values)s::float8[])
                                         AS w(key, weight)
                    WHERE w.key = walk.key LIMIT 1), 1) AS weight
        FROM walk WHERE walk.take
    ) AS k
)
SELECT head.*, held.claim_version FROM keys
CROSS JOIN fair_scope
JOIN held ON held.shard = keys.shard
CROSS JOIN LATERAL (
    SELECT id, priority, run_after, ordered, key_limited, task_path, shard_key, worker_losses, last_attempted_at,
           {{job_problem}} AS problem
    FROM shardq_job
    WHERE {{fair_ready*}} AND fair_key COLLATE "C" = keys.key AND shard = keys.shard
      AND {{claim_walk*}} AND {{claim_key_free}}
    ORDER BY run_after, id
    LIMIT ceil(fair_scope.take * keys.part)::int
    FOR UPDATE SKIP LOCKED
) AS head
LIMIT (SELECT take FROM fair_scope)

-- name: claim_candidates
-- claim_jobs' fourth step (a CTE body over tops and runner_up): the jobs to take, locked (SKIP
-- LOCKED), level by level: only jobs of the runner-up's priority or more, so every job taken
-- outranks or equals every job left, however the limits cut.
-- A shard whose top is above the floor is the only one that has such
-- jobs: it comes first and, when other shards follow, may fill the batch
-- (cut at :per_shard it would leave jobs that outrank theirs). The
-- shards at the floor follow in the fetcher's rotating order,
-- :per_shard each. The next level comes with the next claim (the
-- fetcher goes again at once after a short answer).
-- Jobs with a fair key: while no key gathers jobs in the worker's memory (:fair_walk false) each
-- shard's come as a FIFO slice after its jobs without one; else by the fair round over every
-- held shard (claim_fair), first, for up to fair_scope.take of the batch.
SELECT * FROM (
    (SELECT j.id, j.problem, j.priority, j.run_after, j.ordered, j.key_limited, j.task_path, j.shard_key,
            j.worker_losses, j.last_attempted_at, j.claim_version
     FROM ({{claim_fair*}}) AS j)
    UNION ALL
    (SELECT j.id, j.problem, j.priority, j.run_after, j.ordered, j.key_limited, j.task_path, j.shard_key,
            j.worker_losses, j.last_attempted_at, held.claim_version
     FROM (SELECT tops.*, runner_up.second, runner_up.floor,
                  CASE WHEN tops.priority > runner_up.second THEN %(limit)s ELSE %(per_shard)s END AS take
           FROM tops, runner_up
           WHERE tops.priority >= runner_up.floor
           ORDER BY tops.priority > runner_up.floor DESC, tops.ord) AS held
     CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT id, priority, run_after, ordered, key_limited, task_path, shard_key, worker_losses,
                   last_attempted_at, {{job_problem}} AS problem
            FROM shardq_job
            WHERE shard = held.shard AND priority >= held.floor AND {{claim_walk*}} AND {{fair_column}} IS FALSE
              AND {{claim_key_free}}
            ORDER BY priority DESC, run_after, id
            LIMIT held.take
            FOR UPDATE SKIP LOCKED
        ) AS plain
        UNION ALL
        -- No fair key with two jobs or more in the worker's memory (:fair_walk
        -- false): as many keys as jobs, and the shard's fair jobs come as a FIFO
        -- slice of their range (as cheap as the plain walk; a key that gathers
        -- jobs there makes the next claims go round the keys).
        SELECT * FROM (
            SELECT id, priority, run_after, ordered, key_limited, task_path, shard_key, worker_losses,
                   last_attempted_at, {{job_problem}} AS problem
            FROM shardq_job
            WHERE shard = held.shard AND priority >= held.floor AND {{claim_walk*}} AND {{fair_column}} IS TRUE
              AND {{claim_key_free}} AND NOT %(fair_walk)s
            ORDER BY priority DESC, run_after, id
            LIMIT held.take
            FOR UPDATE SKIP LOCKED
        ) AS fair_slice
     ) AS j)
) AS c
LIMIT %(limit)s

-- name: claim_picked
-- claim_jobs' last step (a CTE body over candidates): each candidate as the SET and RETURNING
-- fragments read it. claim_jobs never starts a job (start_now false): a job is started when a
-- thread begins it (start_jobs), never ahead of its thread.
SELECT c.id, c.problem, c.claim_version, c.last_attempted_at AS previous_attempt_at, false AS start_now
FROM candidates AS c

-- name: claim_jobs
-- Claim READY jobs (due now or within :lookahead seconds) of the shards this worker holds, the
-- highest priorities first across them: one index probe per shard finds its best due priority (no
-- lock); the floor is the second-best of those. Taken are only jobs at or above the floor: first
-- from the one shard above it, if any (its walk may fill the batch), then :per_shard from each
-- shard at the floor, in the given order (a shard alone with work: :per_shard); :limit in all
-- (index range walks, SKIP LOCKED), under each shard's current claim version. So no job left
-- outranks a job taken. Jobs below :min_priority are left alone (the fetcher's claim for jobs that
-- outrank its buffer).
-- Jobs with limit_keys (concurrency and rate limits) are left to claim_limited_candidates /
-- claim_limited_jobs.
-- Only jobs of the worker's queues (:queues, or every queue but :exclude_queues when :all_queues)
-- and of its backend alias (:backend, or any when :any_backend); these are filters on the walk,
-- not index columns.
-- Every job taken is CLAIMED: nothing is counted for it until its thread begins it (start_jobs).
-- A row whose values cannot be read (job_problem) is quarantined: FAILED with an UnreadableJob
-- error naming the value.
-- The steps are named blocks: claim_held, claim_tops, runner_up (here), fair_scope, claim_candidates,
-- claim_picked; :now (None: the database's clock) is the time leases and run_after are read at.
WITH held AS MATERIALIZED {{claim_held}},
tops AS MATERIALIZED {{claim_tops}},
runner_up AS MATERIALIZED (
    -- The second-best top (the best one when two shards share it): no job
    -- left in the table outranks it except in the one shard that leads.
    -- None when at most one shard has work: that shard's walk is the order.
    SELECT second, COALESCE(second, %(min_priority)s) AS floor
    FROM (SELECT (SELECT priority FROM tops ORDER BY priority DESC LIMIT 1 OFFSET 1) AS second) AS s
),
fair_scope AS MATERIALIZED {{fair_scope}},
candidates AS MATERIALIZED {{claim_candidates}},
picked AS MATERIALIZED {{claim_picked}}
UPDATE shardq_job AS job
SET {{claim_status_set*}},
    {{claim_fence_set*}}
FROM picked WHERE job.id = picked.id
RETURNING {{claim_returning*}};

-- name: start_jobs
-- Record the real start of claimed jobs, group-committed (one statement per executor pass):
-- RUNNING, the attempt counted, started_at (first start), last_attempted_at and this worker in
-- worker_ids. Fenced like an ack: the claim's fence and rank, and the shard not handed over since.
-- Returns the jobs started.
UPDATE shardq_job AS job
SET status = 'RUNNING', status_rank = job.status_rank + 1, attempts = job.attempts + 1,
    started_at = COALESCE(job.started_at, clock_timestamp()), last_attempted_at = clock_timestamp(),
    worker_ids = job.worker_ids || jsonb_build_array(%(worker)s::text)
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[]) AS a(id, fence, rank),
     shardq_shard AS s
-- The status test is written "(...) IS TRUE" so that it cannot prove the
-- predicate of shardq_job_inflight_idx: with a plain status = 'CLAIMED' the
-- planner walks that index (its statistics see few CLAIMED rows) and loops
-- over the ids for each entry: 72 ms instead of 14 ms for 300 jobs, measured.
-- Driven from the ids, each row is one primary-key probe.
WHERE job.id = a.id AND job.fence = a.fence AND job.status_rank = a.rank AND (job.status = 'CLAIMED') IS TRUE
  AND s.shard = job.shard AND s.claim_version = job.fence
RETURNING job.id, job.attempts, job.status_rank, job.started_at, job.last_attempted_at;

-- name: outcome_logs
-- The logs an outcome leaves on its job (complete_jobs, complete_and_start_jobs; job is the row, a
-- the outcome): the attempt's entry of per-job logs (a.log, shardq/worker/joblogs.py) appended;
-- when the job's entries would pass a.log_bytes (SHARDQ["JOB_LOG_BYTES"]) of text together, the
-- oldest ones' text gives way to a mark of the bytes cut (the newest is within the bound on its
-- own: the worker cut it so).
CASE WHEN a.log IS NULL THEN job.logs
     WHEN jsonb_typeof(job.logs) IS DISTINCT FROM 'array' THEN jsonb_build_array(a.log)
     WHEN octet_length(job.logs::text) + octet_length(a.log::text) <= a.log_bytes
         THEN job.logs || jsonb_build_array(a.log)
     ELSE (SELECT jsonb_agg(CASE WHEN w.kept THEN w.e
                                 ELSE jsonb_build_object('attempt', w.e -> 'attempt', 'text',
                                          format('… %%s bytes cut', octet_length(w.e ->> 'text')))
                            END ORDER BY w.n)
           FROM (SELECT x.e, x.n,
                        sum(octet_length(x.e ->> 'text')) OVER (ORDER BY x.n DESC) <= a.log_bytes AS kept
                 FROM jsonb_array_elements(job.logs || jsonb_build_array(a.log))
                      WITH ORDINALITY AS x(e, n)) AS w) END

-- name: outcome_columns
-- What an outcome writes (complete_jobs, complete_and_start_jobs; job is the row, a the outcome of
-- the JSON batch, s its shard for outcome_fence): the status and rank, the return value, the error
-- appended, the attempt's log (outcome_logs), the finish time, and a retry's due time.
status = a.status,
status_rank = a.rank,
return_value = a.return_value,
errors = CASE WHEN a.error IS NULL THEN job.errors
              WHEN jsonb_typeof(job.errors) = 'array' THEN job.errors || jsonb_build_array(a.error)
              ELSE jsonb_build_array(a.error) END,
logs = {{outcome_logs}},
finished_at = CASE WHEN a.status = 'READY' THEN NULL ELSE clock_timestamp() END,
run_after = CASE WHEN a.status = 'READY'
                 THEN {{now}} + make_interval(secs => a.delay)
                 ELSE job.run_after END
FROM jsonb_to_recordset(%(batch)s::jsonb)
         AS a(id bigint, fence bigint, rank int, status text, return_value jsonb, error jsonb, delay float8,
              log jsonb, log_bytes int),
     shardq_shard AS s

-- name: outcome_fence
-- An outcome is written only while it is its claim's, fenced twice: the job still carries this
-- claim's fence and rank, and that fence is still its shard's claim version. Only a job in flight:
-- a READY row under the same fence is one whose claim or start was lost with the server
-- (asynchronous commits) while the attempt ran; its outcome is refused and the job runs again, so
-- every recorded outcome belongs to a recorded start. A CLAIMED row takes only the outcome of a
-- job that never started (rank: the claim's + 1): the outcome of an attempt (the start's rank + 1)
-- meeting a CLAIMED row is one whose start write was lost (asynchronous commit, then a failover);
-- it is refused, and return_lost_starts puts the job back to run again. Written "(...) IS TRUE",
-- as in start_jobs, so the planner keeps to the ids.
job.id = a.id
  AND job.fence <= a.fence AND job.status_rank < a.rank
  AND (job.status = 'RUNNING' OR (job.status = 'CLAIMED' AND job.status_rank = a.rank - 1)) IS TRUE
  AND s.shard = job.shard AND s.claim_version = job.fence

-- name: complete_jobs
-- Write outcomes (SUCCESSFUL, FAILED, or READY again for a retry after delay seconds) given as one
-- JSON array, fenced twice: the job still carries this claim's fence and rank, and that fence is
-- still its shard's claim version (the shard has not changed hands since the claim). The (id,
-- rank) pairs returned were written; the rest lost ownership. children_pending says which of them
-- is a workflow parent whose children wait for the resolver. What is written: outcome_columns
-- (the attempt's log appended, bounded: outcome_logs); when: outcome_fence.
UPDATE shardq_job AS job
SET {{outcome_columns*}}
WHERE job.id = ANY(%(ids)s::bigint[]) AND {{outcome_fence*}}
RETURNING job.id, job.status_rank, job.children_pending;

-- name: complete_and_start_jobs
-- complete_jobs and start_jobs in one statement, one round trip: the outcomes queued for the
-- completer ride on the start write of the jobs threads begin now (worker/starter.py), each fenced
-- as its own statement fences it. Rows: (true, id, attempts, status_rank, started_at,
-- last_attempted_at, NULL) for a job started, (false, id, NULL, status_rank, NULL, NULL,
-- children_pending) for an outcome written. The two updates touch different rows (the caller
-- leaves out an outcome of a job it starts).
WITH done AS (
    UPDATE shardq_job AS job
    SET {{outcome_columns*}}
    WHERE job.id = ANY(%(done_ids)s::bigint[]) AND {{outcome_fence*}}
    RETURNING job.id, job.status_rank, job.children_pending
), started AS (
    UPDATE shardq_job AS job
    SET status = 'RUNNING', status_rank = job.status_rank + 1, attempts = job.attempts + 1,
        started_at = COALESCE(job.started_at, clock_timestamp()), last_attempted_at = clock_timestamp(),
        worker_ids = job.worker_ids || jsonb_build_array(%(worker)s::text)
    FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[]) AS a(id, fence, rank),
         shardq_shard AS s
    WHERE job.id = a.id AND job.fence = a.fence AND job.status_rank = a.rank AND (job.status = 'CLAIMED') IS TRUE
      AND s.shard = job.shard AND s.claim_version = job.fence
    RETURNING job.id, job.attempts, job.status_rank, job.started_at, job.last_attempted_at
)
SELECT true, id, attempts, status_rank, started_at, last_attempted_at, NULL::boolean FROM started
UNION ALL
SELECT false, id, NULL::int, status_rank, NULL::timestamptz, NULL::timestamptz, children_pending FROM done;

-- name: complete_job_in_transaction
-- Mark one job SUCCESSFUL inside the task's own transaction (transactional completion), fenced
-- like complete_jobs; returns the shard's claim_version, locked FOR SHARE until COMMIT so no
-- takeover commits in between.
WITH guard AS MATERIALIZED (
    -- A worker paused between this write and its COMMIT must not hold the
    -- job and shard rows forever: the server ends such a session after
    -- :idle_ms, and the uncommitted outcome (with the task's writes) is lost.
    SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true) AS ms
), locked AS MATERIALIZED (
    -- Shard row before job row, like claim_shards and claim_jobs: no deadlock.
    -- The attempt's own lease (its fence names it), still current.
    SELECT s.claim_version FROM shardq_shard AS s, guard
    WHERE s.shard = %(shard)s AND s.claim_version = %(fence)s
    FOR SHARE OF s
)
UPDATE shardq_job AS job
SET status = 'SUCCESSFUL', status_rank = %(rank)s, return_value = %(return_value)s::jsonb,
    finished_at = clock_timestamp()
FROM locked
WHERE job.id = %(id)s AND job.fence <= %(fence)s AND job.status_rank < %(rank)s
  -- As outcome_fence: a CLAIMED row is one whose start write was lost (the
  -- executor hands it back on FenceLost, to run again).
  AND (job.status = 'RUNNING' OR (job.status = 'CLAIMED' AND job.status_rank = %(rank)s - 1)) IS TRUE
RETURNING locked.claim_version;

-- name: outcomes_applied
-- Which of these (id, rank, fence) outcomes are already in the table, as (id, rank) pairs
-- (resolves an ack whose COMMIT outcome is unknown).
-- An outcome written, then moved to shardq_job_history by the archiver before
-- this check (an outage longer than HISTORY_GRACE), is found there.
SELECT job.id, job.status_rank FROM shardq_job AS job
JOIN unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[]) AS a(id, fence, rank)
  ON job.id = a.id AND job.fence = a.fence AND job.status_rank = a.rank
UNION ALL
SELECT job.id, job.status_rank FROM shardq_job_history AS job
JOIN unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[]) AS a(id, fence, rank)
  ON job.id = a.id AND job.fence = a.fence AND job.status_rank = a.rank;

-- name: return_jobs
-- Put claimed jobs that never ran here back to READY, fenced like an ack. A CLAIMED job had
-- nothing counted. A job the claim started (:started) but this worker never ran has its start
-- taken back: the attempt, its worker id, and the times the claim wrote (:previous_attempt_at is
-- the last_attempted_at before it).
UPDATE shardq_job AS job
SET status = 'READY', status_rank = a.rank,
    attempts = job.attempts - a.started::int,
    worker_ids = CASE WHEN a.started THEN job.worker_ids - (jsonb_array_length(job.worker_ids) - 1)
                      ELSE job.worker_ids END,
    started_at = CASE WHEN a.started AND job.attempts = 1 THEN NULL ELSE job.started_at END,
    -- No earlier time known (a claim whose answer was lost): keep the one written.
    last_attempted_at = CASE WHEN NOT a.started THEN job.last_attempted_at
                             WHEN job.attempts = 1 THEN NULL
                             ELSE COALESCE(a.previous_attempt_at, job.last_attempted_at) END
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[], %(started)s::bool[],
            %(previous_attempt_at)s::timestamptz[]) AS a(id, fence, rank, started, previous_attempt_at)
WHERE job.id = a.id AND job.fence <= a.fence AND job.status_rank < a.rank
  AND job.status = CASE WHEN a.started THEN 'RUNNING' ELSE 'CLAIMED' END
RETURNING job.id, job.shard;

-- name: return_lost_starts
-- The jobs among refused outcomes (id, fence, rank) whose start write was lost: the row reads
-- CLAIMED at the claim's rank (the outcome's rank - 2) under this claim's fence, still its shard's
-- claim version. An asynchronous start commit lost in a failover leaves that: the attempt ran, but
-- neither its start nor (refused by outcome_fence) its outcome is recorded. Back to READY at the
-- outcome's rank, due now, no attempt counted, to run again (at least once); without this the row
-- would stay CLAIMED under a live owner that believes it finished. Returns the ids put back.
UPDATE shardq_job AS job
SET status = 'READY', status_rank = a.rank, run_after = clock_timestamp()
FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[]) AS a(id, fence, rank),
     shardq_shard AS s
WHERE job.id = a.id AND job.fence = a.fence AND job.status_rank = a.rank - 2
  AND (job.status = 'CLAIMED') IS TRUE
  AND s.shard = job.shard AND s.claim_version = job.fence
RETURNING job.id;

-- name: defer_unknown_jobs
-- Claimed jobs whose task path this worker cannot resolve (a deploy under way: new code enqueued a
-- task the old workers lack) back to READY, due again in :delay seconds, fenced like return_jobs and
-- with no attempt used (a start the claim wrote is taken back as there). unknown_task_since keeps
-- when a worker first could not resolve it; one that no worker could for :timeout seconds is FAILED
-- instead (dead-lettered: never run again), with an UnknownTask error naming its path. Returns
-- id, shard and whether it was dead-lettered.
WITH a AS (
    SELECT a.*, job.unknown_task_since IS NOT NULL
                AND clock_timestamp() - job.unknown_task_since >= make_interval(secs => %(timeout)s) AS dead
    FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[], %(ranks)s::int[], %(started)s::bool[],
                %(previous_attempt_at)s::timestamptz[]) AS a(id, fence, rank, started, previous_attempt_at)
    JOIN shardq_job AS job ON job.id = a.id
)
UPDATE shardq_job AS job
SET status = CASE WHEN a.dead THEN 'FAILED' ELSE 'READY' END, status_rank = a.rank,
    attempts = job.attempts - a.started::int,
    worker_ids = CASE WHEN a.started THEN job.worker_ids - (jsonb_array_length(job.worker_ids) - 1)
                      ELSE job.worker_ids END,
    started_at = CASE WHEN a.started AND job.attempts = 1 THEN NULL ELSE job.started_at END,
    last_attempted_at = CASE WHEN NOT a.started THEN job.last_attempted_at
                             WHEN job.attempts = 1 THEN NULL
                             ELSE COALESCE(a.previous_attempt_at, job.last_attempted_at) END,
    run_after = CASE WHEN a.dead THEN job.run_after
                     ELSE clock_timestamp() + make_interval(secs => %(delay)s) END,
    unknown_task_since = COALESCE(job.unknown_task_since, clock_timestamp()),
    finished_at = CASE WHEN a.dead THEN clock_timestamp() END,
    errors = CASE WHEN a.dead
        THEN (CASE WHEN jsonb_typeof(job.errors) = 'array' THEN job.errors ELSE '[]'::jsonb END)
             || jsonb_build_array(jsonb_build_object(
                'exception_class_path', 'shardq.exceptions.UnknownTask',
                'traceback', format('shardq.exceptions.UnknownTask: no worker could resolve the task %%s '
                                    || 'for %%s seconds (since %%s; SHARDQ["UNKNOWN_TASK_TIMEOUT"] is %%s): '
                                    || 'dead-lettered, not run. Deploy the code that defines it to the '
                                    || E'workers (or list its module in SHARDQ["TASK_MODULES"]), then retry it.\n',
                                    left(job.task_path, 300),
                                    round(extract(epoch FROM clock_timestamp() - job.unknown_task_since)::numeric, 1),
                                    job.unknown_task_since, %(timeout)s)))
        ELSE job.errors END
FROM a
WHERE job.id = a.id AND job.fence <= a.fence AND job.status_rank < a.rank
  AND job.status = CASE WHEN a.started THEN 'RUNNING' ELSE 'CLAIMED' END
RETURNING job.id, job.shard, a.dead;

-- name: seconds_until_due
-- Seconds until the next deferred READY job of these shards falls due (NULL: none); walks
-- shardq_job_due_idx. A run_after of 'infinity' (a row written by hand) is never due, and no
-- interval reaches it (the subtraction fails): left out.
SELECT extract(epoch FROM run_after - {{now}})::float8
FROM shardq_job
WHERE status = 'READY' AND run_after > {{now}} AND run_after < 'infinity'
  AND shard = ANY(%(shards)s::int[])
ORDER BY run_after
LIMIT 1;

-- name: rescue_jobs
-- The one rescue. Jobs of these shards still CLAIMED or RUNNING under a lease that is gone (their
-- worker lost the shard): a fence that is no longer any pool's current version of the shard, or
-- the version of a lease released or expired for more than :ttl seconds past its end (no worker
-- trusts it any more: its pool has no live worker). a claim never started goes back to READY with
-- nothing charged; an interrupted attempt is a worker loss (worker_losses + 1) and runs again
-- (at-least-once), whatever max_attempts says, until its losses reach :max_worker_losses: then it
-- is dead-lettered as WorkerLost. Returns shard, id, whether it had started, whether it was
-- dead-lettered.
WITH lost AS MATERIALIZED (
    SELECT j.id, h.version, j.status = 'RUNNING' AS started,
           -- LEAST: a hand-written worker_losses at the integer's end must not overflow.
           j.status = 'RUNNING' AND LEAST(j.worker_losses, 2147483646) + 1 >= %(max_worker_losses)s AS dead
    FROM unnest(%(shards)s::int[], %(versions)s::bigint[]) AS h(shard, version)
    JOIN shardq_job AS j ON j.shard = h.shard AND j.status IN ('CLAIMED', 'RUNNING') AND j.fence <> h.version
    -- Another pool's lease of the shard that is still live keeps its jobs.
    WHERE NOT EXISTS (
        SELECT 1 FROM shardq_shard AS l
        WHERE l.shard = j.shard AND l.claim_version = j.fence AND l.owner IS NOT NULL
          AND l.lease_expires > {{now}} - make_interval(secs => %(ttl)s))
    FOR UPDATE OF j
)
UPDATE shardq_job AS j
SET status = CASE WHEN lost.dead THEN 'FAILED' ELSE 'READY' END,
    status_rank = LEAST(j.status_rank, 2147483646) + 1,
    fence = lost.version,
    worker_losses = LEAST(j.worker_losses, 2147483646) + lost.started::int,
    finished_at = CASE WHEN lost.dead THEN clock_timestamp() END,
    errors = CASE WHEN lost.dead
        THEN (CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors ELSE '[]'::jsonb END)
             || jsonb_build_array(jsonb_build_object(
                'exception_class_path', 'shardq.exceptions.WorkerLost',
                'traceback', format('shardq.exceptions.WorkerLost: attempt %%s stopped without recording an '
                                    || 'outcome (its worker was lost; shard %%s was taken over). The job lost '
                                    || '%%s workers in all, the limit (SHARDQ["MAX_WORKER_LOSSES"]) is %%s: '
                                    || E'dead-lettered, not run again.\n',
                                    j.attempts, j.shard, LEAST(j.worker_losses, 2147483646) + 1,
                                    %(max_worker_losses)s)))
        ELSE j.errors END
FROM lost WHERE j.id = lost.id
RETURNING j.shard, j.id, lost.started, lost.dead;

-- name: reserve_job_ids
-- Reserve :n ids from shardq_job's id sequence, the enqueue time and the cluster's shard count
-- (the rows' shards), for a bulk COPY of :n jobs (the sequence is looked up once: MATERIALIZED).
WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('shardq_job', 'id')::regclass AS seq)
SELECT array_agg(nextval(s.seq)), statement_timestamp(), {{shard_count_now}}
FROM s, generate_series(1, %(n)s) AS g(i);

-- name: copy_jobs
-- COPY jobs with the ids reserve_job_ids gave (bulk enqueue; one row a job, columns in this
-- order).
COPY shardq_job {{job_columns}} FROM STDIN;

-- name: notify_shards
-- NOTIFY each of these shards once with the jobs' :priority, 'shard:priority' (delivered at
-- commit): the wake-up after a bulk COPY.
SELECT pg_notify(%(channel)s, s || ':' || %(priority)s::int) FROM unnest(%(shards)s::int[]) AS s;

-- name: my_claimed_jobs
-- CLAIMED (or started by the claim: RUNNING) jobs of these shards under the shard's current
-- version, held by this worker (only the owner claims under the current version): finds claims
-- whose answer never arrived. The caller keeps those it holds in memory.
SELECT j.id, j.fence, j.status_rank, j.shard, j.status = 'RUNNING' AS started
FROM shardq_job AS j
JOIN shardq_shard AS s ON s.shard = j.shard AND s.claim_version = j.fence AND s.owner = %(worker)s
WHERE j.shard = ANY(%(shards)s::int[]) AND j.status IN ('CLAIMED', 'RUNNING');

-- name: prune_jobs
-- Delete the finished jobs (status in :statuses, finished before :cutoff; never a workflow parent
-- whose children still wait or are not moved on yet) among the next :batch ids after :after (a
-- primary-key range walk, no scan of the table); returns the last id looked at, how many were
-- looked at and how many deleted.
WITH batch AS MATERIALIZED (
    SELECT id FROM shardq_job WHERE id > %(after)s ORDER BY id LIMIT %(batch)s
), gone AS (
    -- Conditions on the row being deleted, so one that moved meanwhile (a
    -- dead-lettered job retried from the admin) is re-checked, not deleted.
    -- A parent whose children still wait is kept (their parent_results
    -- read it, an admin Retry revives them from it), and so is one the
    -- resolver has not looked at yet.
    DELETE FROM shardq_job AS j USING batch AS b
    WHERE j.id = b.id AND j.status = ANY(%(statuses)s::text[]) AND j.finished_at < %(cutoff)s
      AND NOT j.children_pending
      AND NOT EXISTS (SELECT 1 FROM shardq_edge AS e JOIN shardq_job AS c ON c.id = e.child
                      WHERE e.parent = j.id AND c.status = 'WAITING')
    RETURNING j.id
), edges AS (
    -- A deleted job's edges to its parents go with it.
    DELETE FROM shardq_edge AS e USING gone WHERE e.child = gone.id
)
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM batch), (SELECT count(*) FROM gone);

-- name: count_prunable_jobs
-- How many jobs prune_jobs would delete (status in :statuses, finished before :cutoff), and the id
-- range to walk.
SELECT count(*) FILTER (WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(cutoff)s),
       min(id), max(id) FILTER (WHERE enqueued_at < %(cutoff)s)
FROM shardq_job;

-- name: admin_retry_failed_jobs
-- Admin "Retry": put the FAILED jobs among :ids back to READY with a fresh budget (attempts 0),
-- due now, status_rank + 1, errors kept as history; compare-and-set on status = 'FAILED', so a job
-- that moved meanwhile is left alone; NOTIFY each retried job's shard and priority as enqueue
-- does, 'shard:priority' with the priority held to Django's -100..100 (a row written by hand may
-- hold more; delivered at commit, equal payloads coalesced). Returns the ids retried.
UPDATE shardq_job
SET status = 'READY', status_rank = status_rank + 1, attempts = 0,
    run_after = clock_timestamp(), finished_at = NULL, unknown_task_since = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'FAILED'
RETURNING id, task_path,
          CASE WHEN %(notify)s THEN pg_notify(%(channel)s, shard || ':' || least(greatest(priority, -100), 100)) END;

-- name: admin_discard_failed_jobs
-- Admin "Discard": delete the FAILED jobs among :ids (compare-and-set on status: a job retried
-- meanwhile stays). A workflow parent whose children the resolver has not moved on yet stays too
-- (deleted, it would leave them WAITING for ever); it can be discarded once they are. Returns the
-- ids deleted.
WITH gone AS (
    DELETE FROM shardq_job WHERE id = ANY(%(ids)s::bigint[]) AND status = 'FAILED' AND NOT children_pending
    RETURNING id, task_path
), edges AS (
    DELETE FROM shardq_edge AS e USING gone WHERE e.child = gone.id
)
SELECT id, task_path FROM gone;

-- name: bounded_json
-- The head of an expression over b.v (a jsonb value) and b.t (it as text): {"bytes": the text's
-- size, "value": the value when that is at most :max_bytes, else null}; the admin_job_*_bounded
-- blocks give it b.
SELECT jsonb_build_object('bytes', octet_length(b.t), 'value', CASE WHEN octet_length(b.t) <= %(max_bytes)s THEN b.v END)

-- name: admin_job_args_bounded
-- A job's args for the admin's list and change page (bounded_json): a large value is never
-- sent to the web process. These admin_job_* expressions name the row's columns unqualified: the
-- same expression serves the list of shardq_job and of shardq_job_history (admin/history.py).
({{bounded_json*}} FROM (SELECT args AS v, args::text AS t) AS b)

-- name: admin_job_kwargs_bounded
-- A job's kwargs, as admin_job_args_bounded.
({{bounded_json*}} FROM (SELECT kwargs AS v, kwargs::text AS t) AS b)

-- name: argument_search_ids
-- The ids of the jobs enqueued with any one of :wheres' keyword-argument values (a jsonb array's
-- elements: kwargs @> each), a subquery for the search (shardq/search.py, argument_filter, which
-- takes these ids first, then the page by primary key). shardq_job_kwargs_idx leaves out the jobs
-- in flight (0028), so they are read through shardq_job_inflight_idx and tested one by one. The
-- first branch's status test is shardq_job_kwargs_idx's predicate word for word, which is what
-- lets the planner use that partial index; the second's is shardq_job_inflight_idx's. (No comment
-- inside the text: it is wrapped in parentheses as it is.)
SELECT j.id FROM shardq_job AS j
WHERE j.kwargs @> ANY(%(wheres)s::jsonb[]) AND NOT (j.status IN ('CLAIMED', 'RUNNING'))
UNION ALL
SELECT j.id FROM shardq_job AS j
WHERE j.status IN ('CLAIMED', 'RUNNING') AND j.kwargs @> ANY(%(wheres)s::jsonb[])

-- name: json_excerpt
-- The head of an expression over b.t (a jsonb value as text): {"text": its first :chars
-- characters, "chars": its length, "bytes": its size}, or NULL for SQL NULL.
SELECT CASE WHEN b.t IS NOT NULL THEN jsonb_build_object('text', left(b.t, %(chars)s),
    'chars', char_length(b.t), 'bytes', octet_length(b.t)) END

-- name: admin_job_return_value_excerpt
-- A job's return value for the admin's change page, as a bounded excerpt (json_excerpt).
({{json_excerpt*}} FROM (SELECT return_value::text AS t) AS b)

-- name: admin_job_worker_ids_excerpt
-- A job's worker ids for the admin's change page, as a bounded excerpt (json_excerpt).
({{json_excerpt*}} FROM (SELECT worker_ids::text AS t) AS b)

-- name: admin_job_errors_excerpt
-- A job's errors for the admin's change page: {"count": N, "errors": [...]}, the oldest and the
-- newest :each_end errors, each with its class path and the first :chars characters of its
-- traceback (and the traceback's size); an element that is not an object (an odd row) as its raw
-- JSON text. A value that is not an array counts as one error.
(WITH e AS (
     SELECT x.e, x.n, count(*) OVER () AS total
     FROM jsonb_array_elements(CASE WHEN jsonb_typeof(errors) = 'array'
                                    THEN errors
                                    ELSE jsonb_build_array(errors) END)
          WITH ORDINALITY AS x(e, n)
 )
 SELECT jsonb_build_object(
     'count', COALESCE(max(e.total), 0),
     'errors', COALESCE(jsonb_agg(
         CASE WHEN jsonb_typeof(e.e) = 'object' THEN jsonb_build_object(
             'n', e.n,
             'exception_class_path', left(e.e ->> 'exception_class_path', 300),
             'traceback', left(e.e ->> 'traceback', %(chars)s),
             'traceback_bytes', octet_length(e.e ->> 'traceback'))
         ELSE jsonb_build_object('n', e.n, 'raw', left(e.e::text, %(chars)s),
                                 'raw_bytes', octet_length(e.e::text)) END
         ORDER BY e.n) FILTER (WHERE e.n <= %(each_end)s OR e.n > e.total - %(each_end)s), '[]'::jsonb))
 FROM e)

-- name: admin_job_logs_excerpt
-- A job's logs for the admin's change page (per-job logs, shardq/worker/joblogs.py): one object an
-- attempt, oldest first, with its attempt number and the first :chars characters of its text (and
-- the text's size); an element that is not an object with a string "text" (an odd row) as its raw
-- JSON text. NULL: none.
(SELECT jsonb_agg(
     CASE WHEN jsonb_typeof(x.e -> 'text') = 'string' THEN jsonb_build_object(
         'n', x.n,
         'attempt', left(x.e ->> 'attempt', 20),
         'text', left(x.e ->> 'text', %(chars)s),
         'text_bytes', octet_length(x.e ->> 'text'))
     ELSE jsonb_build_object('n', x.n, 'raw', left(x.e::text, %(chars)s), 'raw_bytes', octet_length(x.e::text)) END
     ORDER BY x.n)
 FROM jsonb_array_elements(CASE WHEN jsonb_typeof(logs) = 'array' THEN logs
                                ELSE jsonb_build_array(logs) END) WITH ORDINALITY AS x(e, n)
 WHERE logs IS NOT NULL)

-- name: admin_dashboard
-- Admin dashboard, one row a shard plus one totals row (shard NULL): owner and seconds of lease
-- left (of the pool whose lease has the most left), jobs finished in the last :minutes minutes
-- (and how many FAILED), pickup latency p50/p99/mean/max of those (seconds from due, run_after, to
-- the start of the final attempt, last_attempted_at), dead-lettered jobs, READY depth (all, due),
-- the wait of the oldest due READY job, RUNNING jobs.
WITH now AS MATERIALIZED (
    SELECT clock_timestamp() AS t, clock_timestamp() - make_interval(mins => %(minutes)s) AS since
), window_jobs AS (
    -- The jobs finished in the window: those still in shardq_job (the
    -- archiver moves them HISTORY_GRACE seconds after they finished; dead
    -- letters stay), over shardq_job_archivable_idx and shardq_job_failed_idx
    -- (each a range of finished_at: never a read of every dead letter), and
    -- the window's in shardq_job_history.
    {{finished_in_window*}}
), dead AS (
    -- Dead letters per shard and in total, over shardq_job_dead_idx.
    SELECT x.shard, GROUPING(x.shard) = 1 AS is_total, count(*) AS dead
    FROM shardq_job AS x WHERE x.status = 'FAILED' AND x.attempts >= x.max_attempts
    GROUP BY GROUPING SETS ((x.shard), ())
), finished AS (
    -- The window's jobs per shard and in total.
    SELECT j.shard, GROUPING(j.shard) = 1 AS is_total,
           count(*) FILTER (WHERE j.finished_at >= now.since) AS finished,
           count(*) FILTER (WHERE j.finished_at >= now.since AND j.status = 'FAILED') AS failed,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY l.s) FILTER (WHERE j.finished_at >= now.since) AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY l.s) FILTER (WHERE j.finished_at >= now.since) AS p99,
           avg(l.s) FILTER (WHERE j.finished_at >= now.since) AS mean,
           max(l.s) FILTER (WHERE j.finished_at >= now.since) AS max
    FROM window_jobs AS j
    CROSS JOIN now
    -- Epoch differences, not timestamp subtraction: a row with an infinite
    -- timestamp gives ±Infinity (or NaN), not "cannot subtract infinite timestamps".
    CROSS JOIN LATERAL (SELECT (extract(epoch FROM j.last_attempted_at) - extract(epoch FROM j.run_after))::float8 AS s) AS l
    GROUP BY GROUPING SETS ((j.shard), ())
)
SELECT s.shard, s.owner, w.host, w.pid,
       (extract(epoch FROM s.lease_expires) - extract(epoch FROM now.t))::float8,
       COALESCE(f.finished, 0), COALESCE(f.failed, 0), COALESCE(d.dead, 0), f.p50, f.p99, f.mean, f.max,
       r.depth, r.due, r.oldest, (SELECT count(*) FROM shardq_job AS x WHERE x.shard = s.shard AND x.status = 'RUNNING')
FROM (
    -- One row a shard: with several pools, the lease with the most time left
    -- (the shard map lists every pool's lease).
    SELECT DISTINCT ON (shard) shard, owner, lease_expires FROM shardq_shard
    ORDER BY shard, lease_expires DESC NULLS LAST
) AS s
CROSS JOIN now
LEFT JOIN shardq_worker AS w ON w.id = s.owner
LEFT JOIN finished AS f ON f.shard = s.shard AND NOT f.is_total
LEFT JOIN dead AS d ON d.shard = s.shard AND NOT d.is_total
LEFT JOIN LATERAL (
    -- The shard's slice of shardq_job_ready_idx, once.
    SELECT count(*) AS depth,
           count(*) FILTER (WHERE x.run_after <= now.t) AS due,
           (extract(epoch FROM now.t) - extract(epoch FROM min(x.run_after) FILTER (WHERE x.run_after <= now.t)))::float8 AS oldest
    FROM shardq_job AS x WHERE x.shard = s.shard AND x.status = 'READY'
) AS r ON true
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, COALESCE(f.finished, 0), COALESCE(f.failed, 0), COALESCE(d.dead, 0),
       f.p50, f.p99, f.mean, f.max, NULL, NULL, NULL, NULL
FROM (SELECT 1) AS one
LEFT JOIN finished AS f ON f.is_total
LEFT JOIN dead AS d ON d.is_total
ORDER BY 1 NULLS LAST;

-- name: finished_in_window
-- The jobs finished in the last :minutes minutes (and up to a minute more: the caller filters by
-- its own clock), wherever they are (a FROM-able body, included in admin_dashboard and
-- admin_timeseries): in shardq_job the archivable ones over shardq_job_archivable_idx (its
-- predicate repeated, block ``archivable``) and the other FAILED ones (dead letters) over
-- shardq_job_failed_idx, each a range of finished_at; in shardq_job_history the window's
-- partitions (pruned at the statement's start: statement_timestamp() is stable) through their BRIN
-- of finished_at.
SELECT shard, status, attempts, max_attempts, finished_at, last_attempted_at, run_after
FROM shardq_job
WHERE {{archivable*}}
  AND finished_at >= statement_timestamp() - make_interval(mins => %(minutes)s + 1)
UNION ALL
SELECT shard, status, attempts, max_attempts, finished_at, last_attempted_at, run_after
FROM shardq_job
WHERE status = 'FAILED'
  AND (errors -> -1 ->> 'exception_class_path') IS DISTINCT FROM 'shardq.exceptions.Cancelled'
  AND finished_at >= statement_timestamp() - make_interval(mins => %(minutes)s + 1)
UNION ALL
SELECT h.shard, h.status, h.attempts, h.max_attempts, h.finished_at, h.last_attempted_at, h.run_after
FROM shardq_job_history AS h
WHERE h.finished_at >= statement_timestamp() - make_interval(mins => %(minutes)s + 1)

-- name: admin_timeseries
-- Admin dashboard charts, one row a minute of the last :minutes (oldest first; the current minute
-- so far): minute start, jobs finished in it (SUCCESSFUL, FAILED), the p50/p99 pickup latency of
-- those, and, rebuilt from the jobs' own times, how many jobs were due and waiting for their final
-- start at the minute's end and how long the oldest of them had waited (seconds).
-- A job waits from run_after (due) to last_attempted_at (its final attempt's
-- start, the dashboard's pickup latency), or on while READY or CLAIMED. No
-- samples are stored: READY jobs are read over shardq_job_due_idx, CLAIMED and
-- RUNNING ones over shardq_job_inflight_idx, and the jobs finished in the
-- window over indexes of finished_at (block finished_in_window). Earlier
-- attempts of a retried job, and jobs deleted since (Discard, shardq_prune),
-- are not in it.
WITH bounds AS MATERIALIZED (
    SELECT clock_timestamp() AS now,
           date_trunc('minute', clock_timestamp()) - make_interval(mins => %(minutes)s - 1) AS since
), minutes AS (
    SELECT m, LEAST(m + interval '1 minute', b.now) AS edge
    FROM bounds AS b, generate_series(b.since, date_trunc('minute', b.now), interval '1 minute') AS m
), finished AS MATERIALIZED (
    -- The window's jobs, in either table, each over an index (block finished_in_window).
    SELECT w.status, w.run_after, w.last_attempted_at, w.finished_at
    FROM ({{finished_in_window*}}) AS w, bounds AS b
    WHERE w.finished_at >= b.since
), per_minute AS (
    SELECT date_trunc('minute', f.finished_at) AS m,
           count(*) FILTER (WHERE f.status = 'SUCCESSFUL') AS successful,
           count(*) FILTER (WHERE f.status = 'FAILED') AS failed,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY l.s) AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY l.s) AS p99
    FROM finished AS f
    -- Epoch differences: an infinite time gives ±Infinity, not an error.
    CROSS JOIN LATERAL (SELECT (extract(epoch FROM f.last_attempted_at) - extract(epoch FROM f.run_after))::float8 AS s) AS l
    GROUP BY 1
), waits AS MATERIALIZED (
    -- Every wait that overlaps the window, grouped by the minute it began
    -- (or the window's first) and the minute it ended (NULL: waits on);
    -- a wait counts at a minute's end when began <= minute < ended.
    SELECT date_trunc('minute', GREATEST(j.run_after, b.since)) AS began, NULL::timestamptz AS ended,
           count(*) AS n, min(j.run_after) AS oldest_due
    FROM shardq_job AS j, bounds AS b
    WHERE j.status = 'READY' AND j.run_after <= b.now
    GROUP BY 1
    UNION ALL
    SELECT date_trunc('minute', GREATEST(w.due, b.since)), date_trunc('minute', w.started), count(*), min(w.due)
    FROM (
        SELECT j.run_after AS due, CASE WHEN j.status = 'RUNNING' THEN j.last_attempted_at END AS started
        FROM shardq_job AS j, bounds AS b
        WHERE j.status IN ('CLAIMED', 'RUNNING') AND j.run_after <= b.now
        UNION ALL
        SELECT f.run_after, COALESCE(f.last_attempted_at, f.finished_at) FROM finished AS f
    ) AS w, bounds AS b
    WHERE w.started IS NULL OR (w.started >= b.since AND w.started > w.due)
    GROUP BY 1, 2
)
SELECT mi.m, COALESCE(pm.successful, 0), COALESCE(pm.failed, 0), pm.p50, pm.p99,
       COALESCE(w.waiting, 0), (extract(epoch FROM mi.edge) - extract(epoch FROM w.oldest_due))::float8
FROM minutes AS mi
LEFT JOIN per_minute AS pm ON pm.m = mi.m
LEFT JOIN LATERAL (
    SELECT sum(g.n)::bigint AS waiting, min(g.oldest_due) AS oldest_due FROM waits AS g
    WHERE g.began <= mi.m AND (g.ended IS NULL OR g.ended > mi.m)
) AS w ON true
ORDER BY mi.m;

-- name: cancel_jobs
-- Cancel the jobs of :ids that have not finished: READY, WAITING or RUNNING become FAILED with a
-- shardq.exceptions.Cancelled error and status_rank + 1, so the ack of an attempt still running
-- (it carries the claim's rank + 1) can no longer land; a job that was RUNNING is announced on
-- NOTIFY channel shardq_cancel (payload: its id, delivered at commit) so its worker tells the task
-- (context.is_cancelled(), CancelledError); returns the ids cancelled with their queue and task
-- (the metrics' labels).
WITH target AS (
    SELECT id, status AS was FROM shardq_job
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('READY', 'CLAIMED', 'RUNNING', 'WAITING', 'SUSPENDED')
    ORDER BY id
    FOR UPDATE
), cancelled AS (
    UPDATE shardq_job AS job
    SET status = 'FAILED', status_rank = job.status_rank + 1, finished_at = clock_timestamp(),
        errors = job.errors || jsonb_build_array(jsonb_build_object(
            'exception_class_path', 'shardq.exceptions.Cancelled',
            'traceback', format(E'shardq.exceptions.Cancelled: cancelled while %%s%%s\n',
                                CASE WHEN job.status = 'RUNNING' THEN 'running'
                                     WHEN job.status = 'WAITING' THEN 'waiting'
                                     WHEN job.status = 'SUSPENDED' THEN 'suspended' ELSE 'ready' END,
                                CASE WHEN %(reason)s = '' THEN '' ELSE ': ' || %(reason)s END)))
    FROM target
    WHERE job.id = target.id AND job.status IN ('READY', 'CLAIMED', 'RUNNING', 'WAITING', 'SUSPENDED')
    RETURNING job.id, job.queue_name, job.task_path, target.was
)
SELECT c.id, c.queue_name, c.task_path
FROM cancelled AS c
LEFT JOIN LATERAL (SELECT pg_notify('shardq_cancel', c.id::text) WHERE c.was = 'RUNNING') AS n ON true;

-- name: cancelled_attempts
-- Which of these running attempts (id, the rank its outcome would carry) were cancelled: the job
-- is FAILED at that rank or later and its last error is shardq.exceptions.Cancelled (run
-- control's check after a NOTIFY on shardq_cancel, and at every heartbeat while such attempts run).
SELECT job.id FROM shardq_job AS job
JOIN unnest(%(ids)s::bigint[], %(ranks)s::int[]) AS a(id, rank) ON job.id = a.id
WHERE job.status = 'FAILED' AND job.status_rank >= a.rank
  AND jsonb_typeof(job.errors) = 'array'
  AND job.errors -> -1 ->> 'exception_class_path' = 'shardq.exceptions.Cancelled';

-- name: status_jobs
-- shardq_status: jobs by status.
SELECT status, count(*) FROM shardq_job GROUP BY 1 ORDER BY 1;

-- name: status_lag
-- shardq_status: seconds the oldest due READY job has waited (NULL: none is due).
SELECT (extract(epoch FROM clock_timestamp()) - extract(epoch FROM min(run_after)))::float8
FROM shardq_job WHERE status = 'READY' AND run_after <= clock_timestamp();

-- name: status_due_queues
-- shardq_status: the (backend, queue) pairs that have due READY jobs, with how many (to name
-- queues no live pool serves).
SELECT backend, queue_name, count(*) FROM shardq_job
WHERE status = 'READY' AND run_after <= clock_timestamp()
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: metrics_jobs
-- The cluster gauges: unfinished jobs by queue and status (each status has a partial index), with
-- the seconds the oldest due READY job of the queue has waited since its run_after (NULL: none is
-- due).
SELECT queue_name, status, count(*) AS jobs,
       (extract(epoch FROM clock_timestamp())
        - extract(epoch FROM min(run_after) FILTER (WHERE status = 'READY' AND run_after <= clock_timestamp())))::float8
           AS oldest_due_seconds
FROM shardq_job WHERE status IN ('READY', 'CLAIMED', 'RUNNING', 'WAITING', 'SUSPENDED')
GROUP BY 1, 2;

-- name: status_silent_rows
-- shardq_status and the admin: unfinished jobs no worker will ever run, by reason, with how many
-- and up to 10 ids: a shard outside the cluster's 0 .. shard count - 1 (no lease covers it; a row
-- written by hand, or a reshard's move not finished), and WAITING with nothing to wait for (no
-- edge from a parent that is unfinished or whose children are not moved on yet: the resolver will
-- never move it). Each branch walks the partial index of its statuses.
WITH n AS MATERIALIZED (SELECT {{shard_count_now}} AS shards),
outside AS (
    SELECT id FROM shardq_job, n WHERE status = 'READY' AND (shard < 0 OR shard >= n.shards)
    UNION ALL
    SELECT id FROM shardq_job, n WHERE status IN ('CLAIMED', 'RUNNING') AND (shard < 0 OR shard >= n.shards)
    UNION ALL
    SELECT id FROM shardq_job, n WHERE status = 'WAITING' AND (shard < 0 OR shard >= n.shards)
),
orphaned AS (
    SELECT j.id FROM shardq_job AS j, n
    WHERE j.status = 'WAITING' AND j.shard >= 0 AND j.shard < n.shards
      AND NOT EXISTS (
          SELECT 1 FROM shardq_edge AS e JOIN shardq_job AS p ON p.id = e.parent
          WHERE e.child = j.id AND (p.status NOT IN ('SUCCESSFUL', 'FAILED') OR p.children_pending))
)
SELECT 'shard out of range' AS reason, count(*)::int, (array_agg(id ORDER BY id))[1:10] FROM outside
HAVING count(*) > 0
UNION ALL
SELECT 'WAITING on nothing', count(*)::int, (array_agg(id ORDER BY id))[1:10] FROM orphaned
HAVING count(*) > 0;

-- name: status_fair_keys
-- shardq_status's fair keys (docs/fairness.md), per queue and fair key: jobs waiting (READY or
-- CLAIMED), seconds the oldest due one has waited since its run_after (NULL: none due), starts
-- over the last minute (last_attempted_at within it) and their worker seconds so far (to
-- finished_at, or now for a job still running). Jobs without a fair key are left out.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
SELECT j.queue_name, j.fair_key,
       count(*) FILTER (WHERE j.status IN ('READY', 'CLAIMED')) AS backlog,
       (extract(epoch FROM now.t)
        - extract(epoch FROM min(j.run_after) FILTER (WHERE j.status IN ('READY', 'CLAIMED') AND j.run_after <= now.t))
       )::float8 AS oldest_seconds,
       count(*) FILTER (WHERE j.last_attempted_at > now.t - interval '1 minute') AS starts,
       COALESCE(sum(extract(epoch FROM LEAST(COALESCE(j.finished_at, now.t), now.t) - j.last_attempted_at))
                FILTER (WHERE j.last_attempted_at > now.t - interval '1 minute'), 0)::float8 AS seconds
FROM shardq_job AS j, now
WHERE j.fair_key IS NOT NULL
  AND (j.status IN ('READY', 'CLAIMED') OR j.last_attempted_at > now.t - interval '1 minute')
GROUP BY j.queue_name, j.fair_key, now.t;
