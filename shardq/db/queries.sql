-- Every statement shardq runs on a hot path, each a named block.
-- `-- name: NAME` starts a block; the next comment line says what it does.
-- Parameters are psycopg's %(name)s; a literal percent sign is written %%.
-- A block may be an SQL expression that others include as {{NAME}}
-- (in parentheses), so a definition is written once; {{NAME*}} includes it
-- bare (a column list that goes on).

-- name: job_columns
-- The columns a new job is written with, in order: every INSERT of a job and the bulk COPY use
-- this list (shardq/db/enqueue.py writes COPY rows in this order and checks it at import).
id, task_path, backend, queue_name, priority, run_after, shard, key_hash, shard_key, ordered, status,
    status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, limit_keys,
    key_limited

-- name: shard_count_now
-- The cluster's shard count (shardq_cluster, changed by shardq_reshard), or :shard_count
-- (SHARDQ["SHARD_COUNT"]) when the row is missing: an expression. Read in the statement that uses
-- it, so an enqueue places its job with the count current when it runs, with no round trip of its
-- own.
COALESCE((SELECT c.shard_count FROM shardq_cluster AS c WHERE c.id = 1), %(shard_count)s)

-- name: insert_job
-- Insert one READY job on the caller's connection; when :notify, NOTIFY its shard and priority,
-- 'shard:priority' (delivered at commit). Its shard is key_hash & (the cluster's shard count - 1).
WITH job AS (
    INSERT INTO shardq_job {{job_columns}}
    VALUES (DEFAULT, %(task_path)s, %(backend)s, %(queue_name)s, %(priority)s,
        COALESCE(%(run_after)s::timestamptz, statement_timestamp()), %(key_hash)s & ({{shard_count_now}} - 1), %(key_hash)s,
        %(shard_key)s, %(ordered)s, 'READY', 0, 0, 0, %(max_attempts)s, %(args)s::jsonb,
        %(kwargs)s::jsonb, '[]'::jsonb, '[]'::jsonb, statement_timestamp(), %(limit_keys)s::jsonb,
        %(key_limited)s)
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
        %(key_limited)s
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

-- name: release_unique_key
-- Free :unique_key when its holder is :job_id, a job that no longer exists (deleted or pruned
-- inside the key's TTL).
DELETE FROM shardq_unique WHERE key = %(unique_key)s AND job_id = %(job_id)s
  AND NOT EXISTS (SELECT 1 FROM shardq_job WHERE id = %(job_id)s);

-- name: get_job
-- One job by id, every column a TaskResult needs. Times Python cannot hold (±infinity, beyond year
-- 9999: rows written by hand) come back clamped to 9999-12-31 when late, NULL when early.
SELECT id, task_path, backend, queue_name, priority,
       CASE WHEN run_after > '9999-12-31+00' THEN '9999-12-31+00' WHEN run_after < '0001-01-03+00' THEN NULL ELSE run_after END AS run_after,
       status, args, kwargs, return_value, errors, worker_ids,
       CASE WHEN enqueued_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN enqueued_at < '0001-01-03+00' THEN NULL ELSE enqueued_at END AS enqueued_at,
       CASE WHEN started_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN started_at < '0001-01-03+00' THEN NULL ELSE started_at END AS started_at,
       CASE WHEN finished_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN finished_at < '0001-01-03+00' THEN NULL ELSE finished_at END AS finished_at,
       CASE WHEN last_attempted_at > '9999-12-31+00' THEN '9999-12-31+00' WHEN last_attempted_at < '0001-01-03+00' THEN NULL ELSE last_attempted_at END AS last_attempted_at,
       attempts, max_attempts, shard, fence, status_rank
FROM shardq_job WHERE id = %(id)s;

-- name: ensure_shards
-- Create the cluster row (shard count :count) when missing, and the lease rows 0 .. n-1 of pool
-- :pool that do not exist yet, n the larger of :count and the cluster's count (a reshard may have
-- raised it; rows are never deleted).
WITH cluster AS (
    INSERT INTO shardq_cluster (id, shard_count, version) VALUES (1, %(count)s, 1)
    ON CONFLICT (id) DO NOTHING
)
INSERT INTO shardq_shard (pool, shard, owner, lease_expires, claim_version, claimed_at)
SELECT %(pool)s, g, NULL, NULL, 0, NULL
FROM generate_series(0, GREATEST(%(count)s, COALESCE((SELECT shard_count FROM shardq_cluster WHERE id = 1), 0)) - 1) AS g
ON CONFLICT (pool, shard) DO NOTHING;

-- name: register_worker
-- Register a worker incarnation (a fresh UUID every start) of pool :pool and its readable name
-- (--worker-id, '' for none).
INSERT INTO shardq_worker (id, host, pid, queues, pool, started_at, heartbeat_at, state, stats, name)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(pool)s, clock_timestamp(), clock_timestamp(),
        'RUNNING', '{}'::jsonb, %(name)s);

-- name: heartbeat
-- Record this worker's heartbeat and counters; list the live workers of its pool (heartbeat within
-- the TTL, this one included) in a stable order: they share the pool's shards. Each row also
-- carries the cluster's shard count (NULL: no cluster row), which shardq_reshard may have raised.
WITH me AS (
    UPDATE shardq_worker SET heartbeat_at = clock_timestamp(), stats = %(stats)s::jsonb
    WHERE id = %(worker)s
    RETURNING id
)
SELECT w.id, (SELECT count(*) FROM me), (SELECT c.shard_count FROM shardq_cluster AS c WHERE c.id = 1)
FROM shardq_worker w
WHERE w.state = 'RUNNING' AND w.pool = %(pool)s
  AND (w.heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s) OR w.id = %(worker)s)
ORDER BY w.started_at, w.id;

-- name: claim_shards
-- Take up to :wanted unowned or expired shards of pool :pool (SKIP LOCKED), each under a new
-- claim_version from the one sequence; returns shard, claim_version, previous owner. The store
-- then runs rescue_jobs and log_shard_claims in the same transaction.
WITH candidate AS (
    SELECT id, shard, owner FROM shardq_shard
    WHERE pool = %(pool)s AND shard < %(shard_count)s
      AND (owner IS NULL OR lease_expires < clock_timestamp())
    ORDER BY shard
    LIMIT %(wanted)s
    FOR UPDATE SKIP LOCKED
)
UPDATE shardq_shard AS s
SET owner = %(worker)s, claim_version = nextval('shardq_claim_version_seq'),
    lease_expires = clock_timestamp() + make_interval(secs => %(ttl)s),
    claimed_at = clock_timestamp()
FROM candidate AS c WHERE s.id = c.id
RETURNING s.shard, s.claim_version, c.owner AS previous_owner;

-- name: renew_leases
-- Extend exactly the (shard, claim_version) pairs this worker holds in pool :pool; a missing row
-- in the answer means that shard was lost.
WITH locked AS (
    SELECT s.id, s.shard FROM shardq_shard AS s
    JOIN unnest(%(shards)s::int[], %(versions)s::bigint[]) AS h(shard, version)
      ON s.pool = %(pool)s AND s.shard = h.shard AND s.claim_version = h.version AND s.owner = %(worker)s
    ORDER BY s.shard
    FOR UPDATE OF s
)
UPDATE shardq_shard AS s
SET lease_expires = clock_timestamp() + make_interval(secs => %(ttl)s)
FROM locked WHERE s.id = locked.id
RETURNING s.shard;

-- name: release_shards
-- Give up (shard, claim_version) pairs of pool :pool so another worker of the pool can claim them
-- at once; log each release; NOTIFY :channel with this worker's id when any was released (one
-- notification: PostgreSQL folds identical payloads of a transaction), delivered at its commit.
WITH released AS (
    UPDATE shardq_shard AS s SET owner = NULL, lease_expires = NULL
    FROM unnest(%(shards)s::int[], %(versions)s::bigint[]) AS h(shard, version)
    WHERE s.pool = %(pool)s AND s.shard = h.shard AND s.claim_version = h.version AND s.owner = %(worker)s
    RETURNING s.shard, s.claim_version
), logged AS (
    INSERT INTO shardq_shard_event (pool, shard, claim_version, worker, reason, rescued, at)
    SELECT %(pool)s, shard, claim_version, %(worker)s, 'release', 0, clock_timestamp() FROM released
    RETURNING shard
)
SELECT shard, pg_notify(%(channel)s, %(worker)s::text) FROM logged;

-- name: stop_worker
-- Mark a worker incarnation stopped and store its final counters.
UPDATE shardq_worker SET state = 'STOPPED', heartbeat_at = clock_timestamp(), stats = %(stats)s::jsonb
WHERE id = %(worker)s;

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

-- name: claim_start_set
-- What a claim writes on each job it takes (``job``, from ``picked``: its claim_version and whether
-- the claim starts it): the fence, the rank, and for a job started by the claim the attempt, the
-- start times and this worker's id. A SET list fragment, included bare by claim_jobs and
-- claim_limited_jobs.
status_rank = LEAST(job.status_rank, 2147483646) + 1,
    fence = picked.claim_version,
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
    job.key_limited

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
-- The first :start jobs (priority order) that are due, unordered (key_limited: within room) and never lost a worker are
-- started at once (RUNNING, the attempt counted, started_at, last_attempted_at, worker_ids: as
-- start_jobs does): they are what this worker's threads run next, so a separate start write would
-- only add a statement per job. The rest are CLAIMED; nothing is counted for them until
-- start_jobs.
-- A row whose values cannot be read (problem IS NOT NULL) is quarantined: FAILED with an
-- UnreadableJob error naming the value, no arithmetic on it.
WITH held AS MATERIALIZED (
    -- No lock on the shard rows (a FOR SHARE here costs a WAL record per
    -- shard per claim): a claim that races a takeover leaves its rows CLAIMED
    -- under the old version, where starts and acks cannot land (both check the
    -- shard's current version) and the new owner's sweep (rescue_jobs) puts
    -- them back.
    SELECT s.shard, s.claim_version, h.ord,
           -- Another pool's live lease on the shard: its workers may claim
           -- jobs of the same keys (the ordered-key guard below).
           EXISTS (SELECT 1 FROM shardq_shard AS o
                   WHERE o.shard = s.shard AND o.id <> s.id AND o.owner IS NOT NULL
                     AND o.lease_expires > clock_timestamp()) AS shared,
           -- A reshard in progress (shardq_cluster.reshard_from): a key's
           -- unfinished jobs may sit in any shard of this one's family (the
           -- shards equal to it below the old count): its old shard, its new
           -- one, or the old one again for a job placed by a transaction
           -- that began before the count switched. The ordered-key guard
           -- below then looks across the family. NULL: no reshard.
           (SELECT ARRAY(SELECT (s.shard & (c.reshard_from - 1)) + k * c.reshard_from
                         FROM generate_series(0, c.shard_count / c.reshard_from - 1) AS k)
            FROM shardq_cluster AS c WHERE c.id = 1 AND c.reshard_from > 0) AS family
    FROM unnest(%(shards)s::int[]) WITH ORDINALITY AS h(shard, ord)
    JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = h.shard
    WHERE s.owner = %(worker)s AND s.lease_expires > clock_timestamp()
), tops AS MATERIALIZED (
    -- Each held shard's best due priority: one probe of its slice of the
    -- ready index (the same filters as the walk below), no lock taken. A
    -- claim that walked every shard for a few jobs each, as this one did
    -- before, took priority-0 jobs of one shard while another shard's
    -- priority-20 jobs waited in the table; the local queue can only order
    -- what was claimed.
    SELECT held.shard, held.claim_version, held.ord, held.shared, held.family, top.priority
    FROM held
    CROSS JOIN LATERAL (
        SELECT priority FROM shardq_job
        WHERE shard = held.shard AND status = 'READY' AND priority >= %(min_priority)s
          AND run_after <= clock_timestamp() + make_interval(secs => %(lookahead)s)
          -- Limited jobs (docs/limits.md) are claimed by claim_limited_jobs,
          -- which takes their slots and tokens: never here.
          AND limit_keys IS NULL
          AND {{served_jobs*}}
          AND {{open_gates*}}
        ORDER BY priority DESC, run_after, id
        LIMIT 1
    ) AS top
), runner_up AS MATERIALIZED (
    -- The second-best top (the best one when two shards share it): no job
    -- left in the table outranks it except in the one shard that leads.
    -- None when at most one shard has work: that shard's walk is the order.
    SELECT second, COALESCE(second, %(min_priority)s) AS floor
    FROM (SELECT (SELECT priority FROM tops ORDER BY priority DESC LIMIT 1 OFFSET 1) AS second) AS s
), candidates AS MATERIALIZED (
    SELECT j.id, j.problem, j.priority, j.run_after, j.ordered, j.key_limited, j.task_path, j.shard_key,
           j.worker_losses, j.last_attempted_at, held.claim_version
    -- Level by level: only jobs of the runner-up's priority or more, so every
    -- job taken outranks or equals every job left, however the limits cut.
    -- A shard whose top is above the floor is the only one that has such
    -- jobs: it comes first and, when other shards follow, may fill the batch
    -- (cut at :per_shard it would leave jobs that outrank theirs). The
    -- shards at the floor follow in the fetcher's rotating order,
    -- :per_shard each. The next level comes with the next claim (the
    -- fetcher goes again at once after a short answer).
    FROM (SELECT tops.*, runner_up.second, runner_up.floor FROM tops, runner_up
          WHERE tops.priority >= runner_up.floor
          ORDER BY tops.priority > runner_up.floor DESC, tops.ord) AS held
    CROSS JOIN LATERAL (
        SELECT id, priority, run_after, ordered, key_limited, task_path, shard_key, worker_losses, last_attempted_at,
               {{job_problem}} AS problem
        FROM shardq_job
        WHERE shard = held.shard AND status = 'READY' AND priority >= held.floor
          AND run_after <= clock_timestamp() + make_interval(secs => %(lookahead)s)
          AND limit_keys IS NULL  -- limited jobs: claim_limited_jobs (as above)
          AND {{served_jobs*}}
          AND {{open_gates*}}
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
          -- holds across the shard's family (see held.family): each of its
          -- shards may have its own owner.
          AND CASE WHEN ordered AND (held.shared OR held.family IS NOT NULL) THEN NOT EXISTS (
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
              ELSE true END
        ORDER BY priority DESC, run_after, id
        LIMIT CASE WHEN held.priority > held.second THEN %(limit)s ELSE %(per_shard)s END
        FOR UPDATE SKIP LOCKED
    ) AS j
    LIMIT %(limit)s
), picked AS MATERIALIZED (
    SELECT c.id, c.problem, c.claim_version, c.last_attempted_at AS previous_attempt_at,
           c.problem IS NULL AND c.place <= %(start)s AND NOT c.ordered
               -- A job limited by its shard key starts here only within its
               -- key's room in the worker's local queue (:room_* for keys with
               -- jobs running there, else the task's cap, :cap_*; a task it
               -- has not seen: none), counting the batch's jobs of the key
               -- before it: the gate then admits it at once. Else it is
               -- started when a thread takes it (it may wait at the gate).
               AND (NOT c.key_limited OR c.key_place <= COALESCE(
                   (SELECT r.room FROM unnest(%(room_tasks)s::text[], %(room_keys)s::text[], %(rooms)s::int[])
                        AS r(task, key, room) WHERE r.task = c.task_path AND r.key = c.shard_key),
                   (SELECT k.cap FROM unnest(%(cap_tasks)s::text[], %(caps)s::int[]) AS k(task, cap)
                    WHERE k.task = c.task_path),
                   0))
               AND c.worker_losses = 0 AND c.run_after <= clock_timestamp() AS start_now
    FROM (SELECT candidates.*,
                 row_number() OVER (ORDER BY priority DESC, run_after, id) AS place,
                 row_number() OVER (PARTITION BY task_path, shard_key ORDER BY priority DESC, run_after, id) AS key_place
          FROM candidates) AS c
)
UPDATE shardq_job AS job
SET {{claim_status_set*}},
    {{claim_start_set*}}
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

-- name: complete_jobs
-- Write outcomes (SUCCESSFUL, FAILED, or READY again for a retry after delay seconds) given as one
-- JSON array, fenced twice: the job still carries this claim's fence and rank, and that fence is
-- still its shard's claim version (the shard has not changed hands since the claim). The (id,
-- rank) pairs returned were written; the rest lost ownership. children_pending says which of them
-- is a workflow parent whose children wait for the resolver.
UPDATE shardq_job AS job
SET status = a.status,
    status_rank = a.rank,
    return_value = a.return_value,
    errors = CASE WHEN a.error IS NULL THEN job.errors
                  WHEN jsonb_typeof(job.errors) = 'array' THEN job.errors || jsonb_build_array(a.error)
                  ELSE jsonb_build_array(a.error) END,
    finished_at = CASE WHEN a.status = 'READY' THEN NULL ELSE clock_timestamp() END,
    run_after = CASE WHEN a.status = 'READY'
                     THEN clock_timestamp() + make_interval(secs => a.delay)
                     ELSE job.run_after END
FROM jsonb_to_recordset(%(batch)s::jsonb)
         AS a(id bigint, fence bigint, rank int, status text, return_value jsonb, error jsonb, delay float8),
     shardq_shard AS s
WHERE job.id = ANY(%(ids)s::bigint[]) AND job.id = a.id
  AND job.fence <= a.fence AND job.status_rank < a.rank
  AND s.shard = job.shard AND s.claim_version = job.fence
RETURNING job.id, job.status_rank, job.children_pending;

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
RETURNING locked.claim_version;

-- name: outcomes_applied
-- Which of these (id, rank, fence) outcomes are already in the table, as (id, rank) pairs
-- (resolves an ack whose COMMIT outcome is unknown).
SELECT job.id, job.status_rank FROM shardq_job AS job
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

-- name: seconds_until_due
-- Seconds until the next deferred READY job of these shards falls due (NULL: none); walks
-- shardq_job_due_idx. A run_after of 'infinity' (a row written by hand) is never due, and no
-- interval reaches it (the subtraction fails): left out.
SELECT extract(epoch FROM run_after - clock_timestamp())::float8
FROM shardq_job
WHERE status = 'READY' AND run_after > clock_timestamp() AND run_after < 'infinity'
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
          AND l.lease_expires > clock_timestamp() - make_interval(secs => %(ttl)s))
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

-- name: log_shard_claims
-- Log each shard claim (a takeover when it had an owner) with how many jobs its rescue moved.
INSERT INTO shardq_shard_event (pool, shard, claim_version, worker, reason, rescued, at)
SELECT %(pool)s, c.shard, c.version, %(worker)s, CASE WHEN c.previous IS NULL THEN 'claim' ELSE 'takeover' END,
       c.rescued, clock_timestamp()
FROM unnest(%(shards)s::int[], %(versions)s::bigint[], %(previous)s::text[], %(rescued)s::int[])
     AS c(shard, version, previous, rescued);

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

-- name: prune_unique_keys
-- Delete up to :batch expired unique keys (an expired key holds nothing: the next enqueue of it
-- would take it over); returns how many.
WITH gone AS (
    DELETE FROM shardq_unique WHERE key IN (
        SELECT key FROM shardq_unique WHERE expires_at < clock_timestamp() LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: prune_workers
-- Delete worker incarnations whose last heartbeat is older than :cutoff and that own no shard;
-- returns how many.
WITH gone AS (
    DELETE FROM shardq_worker AS w WHERE w.heartbeat_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM shardq_shard AS s WHERE s.owner = w.id)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: prune_shard_events
-- Delete shard claim/release history older than :cutoff; returns how many rows.
WITH gone AS (
    DELETE FROM shardq_shard_event WHERE at < %(cutoff)s RETURNING 1
)
SELECT count(*) FROM gone;

-- name: count_prunable_rest
-- What prune_unique_keys, prune_workers and prune_shard_events would delete (for --dry-run).
SELECT (SELECT count(*) FROM shardq_unique WHERE expires_at < clock_timestamp()),
       (SELECT count(*) FROM shardq_worker AS w WHERE w.heartbeat_at < %(cutoff)s
          AND NOT EXISTS (SELECT 1 FROM shardq_shard AS s WHERE s.owner = w.id)),
       (SELECT count(*) FROM shardq_shard_event WHERE at < %(cutoff)s);

-- name: admin_retry_failed_jobs
-- Admin "Retry": put the FAILED jobs among :ids back to READY with a fresh budget (attempts 0),
-- due now, status_rank + 1, errors kept as history; compare-and-set on status = 'FAILED', so a job
-- that moved meanwhile is left alone; NOTIFY each retried job's shard and priority as enqueue
-- does, 'shard:priority' with the priority held to Django's -100..100 (a row written by hand may
-- hold more; delivered at commit, equal payloads coalesced). Returns the ids retried.
UPDATE shardq_job
SET status = 'READY', status_rank = status_rank + 1, attempts = 0,
    run_after = clock_timestamp(), finished_at = NULL
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

-- name: admin_dashboard
-- Admin dashboard, one row a shard plus one totals row (shard NULL): owner and seconds of lease
-- left (of the pool whose lease has the most left), jobs finished in the last :minutes minutes
-- (and how many FAILED), pickup latency p50/p99/mean/max of those (seconds from due, run_after, to
-- the start of the final attempt, last_attempted_at), dead-lettered jobs, READY depth (all, due),
-- the wait of the oldest due READY job, RUNNING jobs.
WITH now AS MATERIALIZED (
    SELECT clock_timestamp() AS t, clock_timestamp() - make_interval(mins => %(minutes)s) AS since
), finished AS (
    -- One scan of the finished jobs (finished_at has no index: one would
    -- cost every ack a non-HOT update), per shard and in total.
    SELECT j.shard, GROUPING(j.shard) = 1 AS is_total,
           count(*) FILTER (WHERE j.finished_at >= now.since) AS finished,
           count(*) FILTER (WHERE j.finished_at >= now.since AND j.status = 'FAILED') AS failed,
           count(*) FILTER (WHERE j.status = 'FAILED' AND j.attempts >= j.max_attempts) AS dead,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY l.s) FILTER (WHERE j.finished_at >= now.since) AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY l.s) FILTER (WHERE j.finished_at >= now.since) AS p99,
           avg(l.s) FILTER (WHERE j.finished_at >= now.since) AS mean,
           max(l.s) FILTER (WHERE j.finished_at >= now.since) AS max
    FROM shardq_job AS j
    CROSS JOIN now
    -- Epoch differences, not timestamp subtraction: a row with an infinite
    -- timestamp gives ±Infinity (or NaN), not "cannot subtract infinite timestamps".
    CROSS JOIN LATERAL (SELECT (extract(epoch FROM j.last_attempted_at) - extract(epoch FROM j.run_after))::float8 AS s) AS l
    WHERE j.status IN ('SUCCESSFUL', 'FAILED')
    GROUP BY GROUPING SETS ((j.shard), ())
)
SELECT s.shard, s.owner, w.host, w.pid,
       (extract(epoch FROM s.lease_expires) - extract(epoch FROM now.t))::float8,
       COALESCE(f.finished, 0), COALESCE(f.failed, 0), COALESCE(f.dead, 0), f.p50, f.p99, f.mean, f.max,
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
LEFT JOIN LATERAL (
    -- The shard's slice of shardq_job_ready_idx, once.
    SELECT count(*) AS depth,
           count(*) FILTER (WHERE x.run_after <= now.t) AS due,
           (extract(epoch FROM now.t) - extract(epoch FROM min(x.run_after) FILTER (WHERE x.run_after <= now.t)))::float8 AS oldest
    FROM shardq_job AS x WHERE x.shard = s.shard AND x.status = 'READY'
) AS r ON true
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, f.finished, f.failed, f.dead, f.p50, f.p99, f.mean, f.max,
       NULL, NULL, NULL, NULL
FROM finished AS f WHERE f.is_total
ORDER BY 1 NULLS LAST;

-- name: admin_timeseries
-- Admin dashboard charts, one row a minute of the last :minutes (oldest first; the current minute
-- so far): minute start, jobs finished in it (SUCCESSFUL, FAILED), the p50/p99 pickup latency of
-- those, and, rebuilt from the jobs' own times, how many jobs were due and waiting for their final
-- start at the minute's end and how long the oldest of them had waited (seconds).
-- A job waits from run_after (due) to last_attempted_at (its final attempt's
-- start, the dashboard's pickup latency), or on while READY or CLAIMED. No
-- samples are stored: READY jobs are read over shardq_job_due_idx, CLAIMED and
-- RUNNING ones over shardq_job_inflight_idx, and the jobs finished in the
-- window by one scan (finished_at has no index, see admin_dashboard). Earlier
-- attempts of a retried job, and jobs deleted since (Discard, shardq_prune),
-- are not in it.
WITH bounds AS MATERIALIZED (
    SELECT clock_timestamp() AS now,
           date_trunc('minute', clock_timestamp()) - make_interval(mins => %(minutes)s - 1) AS since
), minutes AS (
    SELECT m, LEAST(m + interval '1 minute', b.now) AS edge
    FROM bounds AS b, generate_series(b.since, date_trunc('minute', b.now), interval '1 minute') AS m
), finished AS MATERIALIZED (
    SELECT j.status, j.run_after, j.last_attempted_at, j.finished_at
    FROM shardq_job AS j, bounds AS b
    WHERE j.status IN ('SUCCESSFUL', 'FAILED') AND j.finished_at >= b.since
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
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('READY', 'CLAIMED', 'RUNNING', 'WAITING')
    ORDER BY id
    FOR UPDATE
), cancelled AS (
    UPDATE shardq_job AS job
    SET status = 'FAILED', status_rank = job.status_rank + 1, finished_at = clock_timestamp(),
        errors = job.errors || jsonb_build_array(jsonb_build_object(
            'exception_class_path', 'shardq.exceptions.Cancelled',
            'traceback', format(E'shardq.exceptions.Cancelled: cancelled while %%s%%s\n',
                                CASE WHEN job.status = 'RUNNING' THEN 'running'
                                     WHEN job.status = 'WAITING' THEN 'waiting' ELSE 'ready' END,
                                CASE WHEN %(reason)s = '' THEN '' ELSE ': ' || %(reason)s END)))
    FROM target
    WHERE job.id = target.id AND job.status IN ('READY', 'CLAIMED', 'RUNNING', 'WAITING')
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

-- name: notify
-- Send one NOTIFY (a lease announcement; enqueue NOTIFYs ride on their INSERT).
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: async_commit
-- Commit this session's writes without waiting for the WAL flush (the claim and start connections:
-- a lost claim or start leaves its jobs READY or CLAIMED, never a wrong outcome).
SET synchronous_commit = off;

-- name: worker_liveness
-- The one definition of a worker's liveness (the admin's worker list, shardq_status), an
-- expression over a shardq_worker row: 'stopped' (it said goodbye), 'dead' (no heartbeat for
-- longer than :ttl, LEASE_TTL: its leases expire and its shards are taken over), 'live' (RUNNING
-- with a heartbeat within :ttl: a member of its pool, as the heartbeat statement counts one),
-- 'stopping' (draining after a signal, heartbeat fresh: not a member any more). An odd state reads
-- 'unknown'.
CASE WHEN shardq_worker.state = 'STOPPED' THEN 'stopped'
     WHEN NOT shardq_worker.heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s) THEN 'dead'
     WHEN shardq_worker.state = 'RUNNING' THEN 'live'
     WHEN shardq_worker.state = 'STOPPING' THEN 'stopping'
     ELSE 'unknown' END

-- name: status_workers
-- shardq_status: the workers not stopped, oldest first: id, name, host, pid, pool, state, liveness
-- (worker_liveness), heartbeat age in seconds (epoch difference: an infinite time gives
-- ±Infinity), stats as text, live shards held.
SELECT shardq_worker.id::text, shardq_worker.name, shardq_worker.host, shardq_worker.pid, shardq_worker.pool,
       shardq_worker.state, {{worker_liveness}},
       (extract(epoch FROM clock_timestamp()) - extract(epoch FROM shardq_worker.heartbeat_at))::float8,
       shardq_worker.stats::text,
       (SELECT count(*) FROM shardq_shard AS s
        WHERE s.owner = shardq_worker.id AND s.lease_expires > clock_timestamp())
FROM shardq_worker WHERE shardq_worker.state <> 'STOPPED' ORDER BY shardq_worker.started_at;

-- name: status_jobs
-- shardq_status: jobs by status.
SELECT status, count(*) FROM shardq_job GROUP BY 1 ORDER BY 1;

-- name: status_lag
-- shardq_status: seconds the oldest due READY job has waited (NULL: none is due).
SELECT (extract(epoch FROM clock_timestamp()) - extract(epoch FROM min(run_after)))::float8
FROM shardq_job WHERE status = 'READY' AND run_after <= clock_timestamp();

-- name: status_pools
-- shardq_status: each pool with its live workers (worker_liveness), its shards held under a live
-- lease and its shards unowned or expired.
SELECT s.pool,
       (SELECT count(*) FROM shardq_worker
        WHERE shardq_worker.pool = s.pool AND {{worker_liveness}} = 'live') AS workers,
       count(*) FILTER (WHERE s.owner IS NOT NULL AND s.lease_expires > clock_timestamp()) AS held,
       count(*) FILTER (WHERE s.owner IS NULL OR s.lease_expires <= clock_timestamp()) AS unowned
FROM shardq_shard AS s
WHERE s.shard < {{shard_count_now}}
GROUP BY s.pool ORDER BY s.pool;

-- name: status_due_queues
-- shardq_status: the (backend, queue) pairs that have due READY jobs, with how many (to name
-- queues no live pool serves).
SELECT backend, queue_name, count(*) FROM shardq_job
WHERE status = 'READY' AND run_after <= clock_timestamp()
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: time_before
-- The database's time :age (an interval) ago: the cutoff of shardq_prune.
SELECT clock_timestamp() - %(age)s;

-- name: metrics_lock
-- Take or keep the session advisory lock (:classid, :objid) that makes this connection's worker
-- the one that computes the cluster gauges; true while this session holds it (looked up in
-- pg_locks first, so keeping it never stacks a second hold). Released with the session: a dead
-- worker's lock goes to the next worker that asks.
SELECT EXISTS (SELECT 1 FROM pg_locks
               WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                 AND classid = %(classid)s::int::oid AND objid = %(objid)s::int::oid AND objsubid = 2)
       OR pg_try_advisory_lock(%(classid)s::int, %(objid)s::int);

-- name: metrics_jobs
-- The cluster gauges: unfinished jobs by queue and status (each status has a partial index), with
-- the seconds the oldest due READY job of the queue has waited since its run_after (NULL: none is
-- due).
SELECT queue_name, status, count(*) AS jobs,
       (extract(epoch FROM clock_timestamp())
        - extract(epoch FROM min(run_after) FILTER (WHERE status = 'READY' AND run_after <= clock_timestamp())))::float8
           AS oldest_due_seconds
FROM shardq_job WHERE status IN ('READY', 'CLAIMED', 'RUNNING', 'WAITING')
GROUP BY 1, 2;

-- name: metrics_unowned_shards
-- The cluster gauge of shards unowned or expired, summed over the pools that have a live worker
-- (heartbeat within :ttl); a pool nobody runs any more is not counted.
SELECT count(*) FROM shardq_shard AS s
WHERE s.shard < {{shard_count_now}} AND (s.owner IS NULL OR s.lease_expires <= clock_timestamp())
  AND EXISTS (SELECT 1 FROM shardq_worker AS w
              WHERE w.pool = s.pool AND w.state = 'RUNNING'
                AND w.heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s));

-- name: reshard_state
-- shardq_reshard: the cluster row (shard count, version, the count before a reshard in progress or
-- NULL, when the count switched), and whether this session could take the reshard lock (:classid,
-- :objid; held for the session, so a second shardq_reshard sees a live one).
SELECT c.shard_count, c.version, c.reshard_from, c.switched_at,
       pg_try_advisory_lock(%(classid)s::int, %(objid)s::int) AS locked
FROM shardq_cluster AS c WHERE c.id = 1;

-- name: reshard_unlock
-- shardq_reshard: give back the reshard lock this session took.
SELECT pg_advisory_unlock(%(classid)s::int, %(objid)s::int);

-- name: reshard_plan
-- shardq_reshard: what raising the count from :from to :to does: READY (and WAITING: workflow
-- children not yet claimable) jobs that move to a new
-- shard, jobs in flight that finish where they are, and the pools whose lease rows it adds.
SELECT (SELECT count(*) FROM shardq_job WHERE status IN ('READY', 'WAITING') AND shard <> key_hash & (%(to)s - 1)),
       (SELECT count(*) FROM shardq_job WHERE status IN ('CLAIMED', 'RUNNING') AND shard <> key_hash & (%(to)s - 1)),
       (SELECT array_agg(DISTINCT pool ORDER BY pool) FROM shardq_shard);

-- name: reshard_switch
-- shardq_reshard: raise the cluster's shard count from :from to :to and mark the reshard running
-- (reshard_from), with the lease rows of the new shards for every pool, in one transaction;
-- NOTIFYs the workers to run a lease round now. No row when the count is no longer :from or a
-- reshard is marked running (another command got there first).
WITH rows AS (
    INSERT INTO shardq_shard (pool, shard, owner, lease_expires, claim_version, claimed_at)
    SELECT p.pool, g, NULL, NULL, 0, NULL
    FROM (SELECT DISTINCT pool FROM shardq_shard) AS p, generate_series(0, %(to)s - 1) AS g
    ON CONFLICT (pool, shard) DO NOTHING
)
UPDATE shardq_cluster
SET shard_count = %(to)s, reshard_from = %(from)s, version = version + 1, switched_at = clock_timestamp()
WHERE id = 1 AND shard_count = %(from)s AND reshard_from IS NULL
RETURNING version, switched_at, pg_notify('shardq_lease', 'reshard');

-- name: reshard_move
-- shardq_reshard: move up to :batch READY jobs of shard :shard that belong elsewhere under :to
-- shards to key_hash & (:to - 1) (SKIP LOCKED: a job a claim is taking stays, in flight, and
-- finishes where it is; status_rank + 1, as at every write); NOTIFY each shard that got jobs.
-- Returns how many moved.
WITH picked AS MATERIALIZED (
    SELECT id FROM shardq_job
    WHERE shard = %(shard)s AND status IN ('READY', 'WAITING') AND shard <> key_hash & (%(to)s - 1)
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE shardq_job AS j
    SET shard = j.key_hash & (%(to)s - 1), status_rank = LEAST(j.status_rank, 2147483646) + 1
    FROM picked WHERE j.id = picked.id
    RETURNING j.shard, j.priority
)
SELECT (SELECT count(*) FROM moved),
       (SELECT count(pg_notify(%(channel)s, d.shard || ':' || d.priority))
        FROM (SELECT shard, max(priority) AS priority FROM moved GROUP BY shard) AS d);

-- name: reshard_misplaced
-- shardq_reshard: the shards (below :to) holding READY jobs that belong elsewhere under :to
-- shards, and how many jobs in flight (CLAIMED, RUNNING) are not yet in their shard (they finish
-- where they are; a retry comes back READY and moves).
SELECT (SELECT COALESCE(array_agg(DISTINCT shard ORDER BY shard), '{}') FROM shardq_job
        WHERE status IN ('READY', 'WAITING') AND shard <> key_hash & (%(to)s - 1)),
       (SELECT count(*) FROM shardq_job WHERE status IN ('CLAIMED', 'RUNNING') AND shard <> key_hash & (%(to)s - 1));

-- name: reshard_old_transactions
-- shardq_reshard: sessions of this database (other than this one) in a transaction begun before
-- :switched_at: such a transaction may still commit jobs placed with the old count. Also how many
-- sessions this role cannot see into (other roles' sessions without pg_read_all_stats).
SELECT COALESCE(array_agg(pid ORDER BY pid) FILTER (WHERE xact_start < %(switched_at)s), '{}'),
       count(*) FILTER (WHERE state IS NULL AND backend_type = 'client backend')
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid();

-- name: reshard_finish
-- shardq_reshard: every unfinished job sits in its shard and no transaction from before the switch
-- is left: the reshard is over (reshard_from NULL, version + 1).
UPDATE shardq_cluster SET reshard_from = NULL, version = version + 1
WHERE id = 1 AND reshard_from IS NOT NULL
RETURNING version;

-- name: copy_workflow_jobs
-- COPY a workflow's jobs with the ids reserve_job_ids gave (Workflow.enqueue): as copy_jobs, plus
-- each job's parents still to wait for (WAITING when any), whether it has children, and the
-- workflow's name.
COPY shardq_job ({{job_columns*}}, waiting_on, children_pending, workflow) FROM STDIN;

-- name: copy_edges
-- COPY a workflow's edges (child waits for parent; name is the parent's key in the child's
-- parent_results).
COPY shardq_edge (parent, child, name, run_on_failure, resolved) FROM STDIN;

-- name: link_parents
-- Mark jobs that already exist as parents of new children (task.using(after=...),
-- Workflow.add(after=[result])): children_pending, so the resolver looks at them once they have
-- finished (or now, if they have). Returns the ids that exist; a missing one is the caller's
-- error.
UPDATE shardq_job SET children_pending = true
WHERE id = ANY(%(ids)s::bigint[])
RETURNING id, task_path;

-- name: resolve_children
-- The resolver, off the completion path: up to :batch finished parents (SUCCESSFUL or FAILED) of
-- these shards whose children it has not moved on yet (shardq_job_resolve_idx, SKIP LOCKED), in
-- one statement, so a crash anywhere in it leaves the parents to the next pass. Their unresolved
-- edges are counted off each child's waiting_on; a WAITING child whose parent failed
-- (dead-lettered or cancelled) and which did not ask to run anyway becomes FAILED with
-- shardq.exceptions.ParentFailed naming that parent (its own children then follow at the next
-- pass: it is a finished parent too); one with nothing left to wait for becomes READY (due now)
-- and its shard is NOTIFYed. Returns each child moved: id, shard, new status, the parent's id.
WITH parents AS MATERIALIZED (
    SELECT p.id, p.status, p.task_path FROM shardq_job AS p
    WHERE p.shard = ANY(%(shards)s::int[]) AND p.children_pending
      AND p.status IN ('SUCCESSFUL', 'FAILED')
    ORDER BY p.shard, p.id
    LIMIT %(batch)s
    FOR UPDATE OF p SKIP LOCKED
), edges AS MATERIALIZED (
    UPDATE shardq_edge AS e SET resolved = true
    FROM parents
    WHERE e.parent = parents.id AND NOT e.resolved
    RETURNING e.child, e.parent, parents.status AS parent_status, parents.task_path, e.run_on_failure
), per_child AS MATERIALIZED (
    SELECT child, count(*)::int AS n,
           min(parent) FILTER (WHERE parent_status = 'FAILED' AND NOT run_on_failure) AS failed_parent
    FROM edges GROUP BY child
), locked AS MATERIALIZED (
    -- Children in id order: two resolvers sharing a child (a fan-in) never
    -- lock two of them in opposite orders.
    SELECT c.id FROM shardq_job AS c JOIN per_child ON c.id = per_child.child
    ORDER BY c.id
    FOR UPDATE OF c
), moved AS (
    -- GREATEST(c.waiting_on, 0) and LEAST(c.status_rank, ...): a child's
    -- counters written by hand at the integer's ends must not overflow, or
    -- the whole pass fails, every pass, and every other child of the batch
    -- waits with it. (A negative waiting_on meant "nothing to wait for"
    -- already; the claim quarantines a rank it cannot read.)
    UPDATE shardq_job AS c
    SET waiting_on = GREATEST(GREATEST(c.waiting_on, 0) - pc.n, 0),
        -- A child that is also a parent of this batch (cancelled while it
        -- waited) is marked here: one row is never updated twice in one statement.
        children_pending = c.children_pending AND c.id NOT IN (SELECT id FROM parents),
        status = CASE WHEN c.status <> 'WAITING' THEN c.status
                      WHEN pc.failed_parent IS NOT NULL THEN 'FAILED'
                      WHEN GREATEST(c.waiting_on, 0) - pc.n <= 0 THEN 'READY'
                      ELSE 'WAITING' END,
        status_rank = LEAST(c.status_rank, 2147483646) + CASE WHEN c.status = 'WAITING'
            AND (pc.failed_parent IS NOT NULL OR GREATEST(c.waiting_on, 0) - pc.n <= 0) THEN 1 ELSE 0 END,
        run_after = CASE WHEN c.status = 'WAITING' AND pc.failed_parent IS NULL
                              AND GREATEST(c.waiting_on, 0) - pc.n <= 0
                         THEN GREATEST(c.run_after, clock_timestamp()) ELSE c.run_after END,
        finished_at = CASE WHEN c.status = 'WAITING' AND pc.failed_parent IS NOT NULL
                           THEN clock_timestamp() ELSE c.finished_at END,
        errors = CASE WHEN c.status = 'WAITING' AND pc.failed_parent IS NOT NULL
            THEN (CASE WHEN jsonb_typeof(c.errors) = 'array' THEN c.errors ELSE '[]'::jsonb END)
                 || jsonb_build_array(jsonb_build_object(
                    'exception_class_path', 'shardq.exceptions.ParentFailed',
                    'traceback', format(E'shardq.exceptions.ParentFailed: parent job %%s (%%s) ended FAILED '
                                        || E'(dead-lettered or cancelled), so this job (on_parent_failure='
                                        || E'"cancel") will not run.\n',
                                        pc.failed_parent,
                                        (SELECT e.task_path FROM edges AS e WHERE e.parent = pc.failed_parent LIMIT 1))))
            ELSE c.errors END
    FROM per_child AS pc, locked
    WHERE c.id = pc.child AND locked.id = c.id
    RETURNING c.id, c.shard, c.priority, c.status, pc.failed_parent
), done AS (
    UPDATE shardq_job AS p SET children_pending = false
    FROM parents WHERE p.id = parents.id AND p.id NOT IN (SELECT child FROM per_child)
    RETURNING p.id
)
SELECT m.id, m.shard, m.status, m.failed_parent, (SELECT count(*) FROM parents) AS parents,
       CASE WHEN m.status = 'READY' AND %(notify)s
            THEN pg_notify(%(channel)s, m.shard || ':' || least(greatest(m.priority, -100), 100)) END
FROM moved AS m
UNION ALL
-- One row even when no child moved: how many parents were resolved.
SELECT NULL, NULL, NULL, NULL, (SELECT count(*) FROM parents), NULL
WHERE NOT EXISTS (SELECT 1 FROM moved);

-- name: revive_children
-- Admin "Retry" of dead-lettered jobs (:ids, just put back to READY): the children each cancelled
-- with ParentFailed, and theirs, recursively, go back to WAITING (status_rank + 1, not finished).
-- Every edge into a revived child whose parent has not succeeded is unresolved again and its
-- parent marked children_pending, so waiting_on counts it: the retried parent is waited for, and a
-- parent still FAILED cancels the child again at the resolver's next pass. Returns the ids
-- revived.
WITH RECURSIVE revived(id) AS (
    SELECT e.child FROM shardq_edge AS e JOIN shardq_job AS c ON c.id = e.child
    WHERE e.parent = ANY(%(ids)s::bigint[]) AND c.status = 'FAILED'
      AND c.errors -> -1 ->> 'traceback' LIKE 'shardq.exceptions.ParentFailed: parent job ' || e.parent || ' %%'
    UNION
    SELECT e.child FROM revived AS r
    JOIN shardq_edge AS e ON e.parent = r.id
    JOIN shardq_job AS c ON c.id = e.child
    WHERE c.status = 'FAILED'
      AND c.errors -> -1 ->> 'traceback' LIKE 'shardq.exceptions.ParentFailed: parent job ' || e.parent || ' %%'
), reopened AS MATERIALIZED (
    UPDATE shardq_edge AS e SET resolved = false
    FROM revived, shardq_job AS p
    WHERE e.child = revived.id AND p.id = e.parent AND p.status <> 'SUCCESSFUL'
    RETURNING e.parent
), parents AS (
    -- Data-modifying: runs whether or not it is read. A revived job that is
    -- a parent too is marked by the UPDATE below (one row is never updated
    -- twice in one statement).
    UPDATE shardq_job AS p SET children_pending = true
    WHERE p.id IN (SELECT parent FROM reopened) AND p.id NOT IN (SELECT id FROM revived)
)
UPDATE shardq_job AS c
SET status = 'WAITING', status_rank = c.status_rank + 1, finished_at = NULL,
    children_pending = c.children_pending OR c.id IN (SELECT parent FROM reopened),
    -- Its unresolved edges once reopened is applied (this snapshot sees the
    -- edges before it, and the retried parents already READY).
    waiting_on = (SELECT count(*) FROM shardq_edge AS e JOIN shardq_job AS p ON p.id = e.parent
                  WHERE e.child = c.id AND (p.status <> 'SUCCESSFUL' OR NOT e.resolved))
WHERE c.id IN (SELECT id FROM revived) AND c.status = 'FAILED'
RETURNING c.id;

-- name: parent_results
-- A job's parents (context.parent_results): the edge's name, then every column get_job returns.
SELECT e.name AS step_name, j.id, j.task_path, j.backend, j.queue_name, j.priority, j.run_after, j.status, j.args, j.kwargs,
       j.return_value, j.errors, j.worker_ids, j.enqueued_at, j.started_at, j.finished_at, j.last_attempted_at
FROM shardq_edge AS e JOIN shardq_job AS j ON j.id = e.parent
WHERE e.child = %(id)s
ORDER BY e.name;

-- name: workflow_graph
-- The admin's workflow graph: every job connected to :id by edges (either way), at most :limit,
-- with status, task and name, and the edges among them.
WITH RECURSIVE part(id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT CASE WHEN e.parent = part.id THEN e.child ELSE e.parent END
    FROM part JOIN shardq_edge AS e ON e.parent = part.id OR e.child = part.id
), nodes AS MATERIALIZED (
    SELECT id FROM part ORDER BY id LIMIT %(limit)s
)
SELECT 'node' AS kind, j.id, NULL::bigint AS child, j.status, j.task_path, j.workflow, NULL AS name
FROM nodes JOIN shardq_job AS j ON j.id = nodes.id
UNION ALL
SELECT 'edge', e.parent, e.child, NULL, NULL, NULL, e.name
FROM shardq_edge AS e
WHERE e.parent IN (SELECT id FROM nodes) AND e.child IN (SELECT id FROM nodes);

-- name: has_edges
-- Whether job :id has a parent or a child (the admin links its workflow graph then).
SELECT EXISTS (SELECT 1 FROM shardq_edge WHERE parent = %(id)s OR child = %(id)s);

-- Concurrency and rate limits (docs/limits.md). A limited claim is one
-- transaction on the fetcher's connection: claim_limited_candidates locks
-- the candidate jobs, take_limit_slots and lock_limit_rates lock what the
-- limits have left (slots SKIP LOCKED, rate rows in sorted key order), the
-- worker picks the jobs every limit has room for, and claim_limited_jobs
-- writes slots, rates and claims at once.

-- name: claim_limited_candidates
-- Lock up to :per_shard due READY limited jobs (limit_keys set) of each shard this worker holds in
-- pool :pool, in claim order (priority, run_after, id) over shardq_job_ready_idx, :scan in all,
-- FOR UPDATE SKIP LOCKED; jobs with a key in :full (limits known to be full) are passed over
-- without a lock, so they keep their place and do not hold back other jobs of the shard. Same
-- queue and backend filters as claim_jobs. A row job_problem finds unreadable comes with its
-- problem (and no limit_keys: they may be any JSON), for claim_limited_jobs to quarantine; the
-- limiter never sees it.
SELECT j.id, j.shard, j.task_path, CASE WHEN j.problem IS NULL THEN j.limit_keys END AS limit_keys, j.problem
FROM unnest(%(shards)s::int[]) WITH ORDINALITY AS h(shard, ord)
JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = h.shard
CROSS JOIN LATERAL (
    SELECT id, shard, task_path, limit_keys, priority, run_after, {{job_problem}} AS problem FROM shardq_job
    -- (limit_keys IS NULL) IS FALSE: written so, it is the equality on
    -- shardq_job_ready_idx's second column that keeps this walk to the
    -- shard's limited jobs (limit_keys IS NOT NULL would filter every row).
    WHERE shard = h.shard AND status = 'READY' AND (limit_keys IS NULL) IS FALSE
      -- Due now, no look-ahead: a rate token is spent when the job is claimed.
      AND run_after <= clock_timestamp()
      AND NOT (limit_keys ?| %(full)s::text[])
      AND {{served_jobs*}}
    ORDER BY priority DESC, run_after, id
    LIMIT %(per_shard)s
    FOR UPDATE SKIP LOCKED
) AS j
WHERE s.owner = %(worker)s AND s.lease_expires > clock_timestamp()
ORDER BY j.priority DESC, j.run_after, j.id
LIMIT %(scan)s;

-- name: claim_limited_owned
-- The limited claim in one statement, for the jobs this worker already owns slots for (no slot to
-- take, no rate to debit): walk up to :per_shard due READY limited jobs of each shard it holds,
-- in claim order, FOR UPDATE SKIP LOCKED, passing over (without a lock) jobs with a key not in
-- :keys (a limit it owns no room of, or a rate limit); take, in claim order, the ones every key
-- of has room (:rooms, one per key of :keys; a job's place among a key's candidates counts
-- against that key's room, so no key gets more than its room), :limit in all, under each shard's
-- current claim version; the first :start are started as claim_jobs starts them. Same queue and
-- backend filters as claim_jobs. A row job_problem finds unreadable among those walked is
-- quarantined, as claim_jobs does. Returns claim_jobs' columns.
WITH held AS MATERIALIZED (
    SELECT s.shard, s.claim_version
    FROM unnest(%(shards)s::int[]) AS h(shard)
    JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = h.shard
    WHERE s.owner = %(worker)s AND s.lease_expires > clock_timestamp()
), candidates AS MATERIALIZED (
    SELECT j.id, j.limit_keys, j.problem, j.ordered, j.key_limited, j.worker_losses, j.last_attempted_at,
           held.claim_version, row_number() OVER (ORDER BY j.priority DESC, j.run_after, j.id) AS place
    FROM held
    CROSS JOIN LATERAL (
        SELECT id, limit_keys, ordered, key_limited, worker_losses, last_attempted_at, priority, run_after,
               {{job_problem}} AS problem
        FROM shardq_job
        -- (limit_keys IS NULL) IS FALSE: shardq_job_ready_idx's limited range (as claim_limited_candidates).
        WHERE shard = held.shard AND status = 'READY' AND (limit_keys IS NULL) IS FALSE
          AND run_after <= clock_timestamp()
          AND limit_keys <@ %(keys_json)s::jsonb
          AND {{served_jobs*}}
        ORDER BY priority DESC, run_after, id
        LIMIT %(per_shard)s
        FOR UPDATE SKIP LOCKED
    ) AS j
), fits AS (
    SELECT x.id
    FROM (SELECT c.id, e.key, row_number() OVER (PARTITION BY e.key ORDER BY c.place) AS n
          -- An unreadable row's limit_keys may be no array (a scalar string passes the walk's <@).
          FROM candidates AS c
          CROSS JOIN LATERAL jsonb_array_elements_text(CASE WHEN c.problem IS NULL THEN c.limit_keys
                                                            ELSE '[]' END) AS e(key)) AS x
    JOIN unnest(%(keys)s::text[], %(rooms)s::int[]) AS r(key, room) ON r.key = x.key
    GROUP BY x.id
    HAVING bool_and(x.n <= r.room)
), picked AS MATERIALIZED (
    SELECT c.id, c.claim_version, c.last_attempted_at AS previous_attempt_at, c.problem,
           c.problem IS NULL AND row_number() OVER (ORDER BY c.place) <= %(start)s AND NOT c.ordered
               AND NOT c.key_limited AND c.worker_losses = 0 AS start_now
    FROM candidates AS c LEFT JOIN fits ON fits.id = c.id
    WHERE fits.id IS NOT NULL OR c.problem IS NOT NULL
    ORDER BY c.place
    LIMIT %(limit)s
)
UPDATE shardq_job AS job
SET {{claim_status_set*}},
    {{claim_start_set*}}
FROM picked
WHERE job.id = picked.id
RETURNING {{claim_returning*}};

-- name: ensure_limit_slots
-- Create the slot rows 0 .. cap-1 of each concurrency limit key that do not exist yet (a lowered
-- cap leaves the rows above it unused: take_limit_slots reads slot < cap).
INSERT INTO shardq_limit_slot (limit_key, slot)
SELECT k.key, g.slot
FROM unnest(%(keys)s::text[], %(caps)s::int[]) AS k(key, cap)
CROSS JOIN LATERAL generate_series(0, k.cap - 1) AS g(slot)
ON CONFLICT ON CONSTRAINT shardq_limit_slot_key_uniq DO NOTHING;

-- name: take_limit_slots
-- Lock up to :wanted free slots of each concurrency limit key below its :cap (free: no owner, or
-- an owner's lease that expired: it died), SKIP LOCKED so concurrent claimers take different slots
-- and never wait on each other. Returns key, slot row id.
SELECT k.key, t.id
FROM unnest(%(keys)s::text[], %(caps)s::int[], %(wanted)s::int[]) WITH ORDINALITY AS k(key, cap, wanted, ord)
CROSS JOIN LATERAL (
    SELECT id, slot FROM shardq_limit_slot
    WHERE limit_key = k.key AND slot < k.cap AND (worker_id IS NULL OR expires_at < clock_timestamp())
    ORDER BY slot
    LIMIT k.wanted
    FOR UPDATE SKIP LOCKED
) AS t
ORDER BY k.ord, t.slot;

-- name: ensure_limit_rates
-- Create the GCRA row of each rate limit key that does not exist yet (tat: now, a full burst).
INSERT INTO shardq_limit_rate (limit_key, tat)
SELECT k, clock_timestamp() FROM unnest(%(keys)s::text[]) AS k
ON CONFLICT (limit_key) DO NOTHING;

-- name: lock_limit_rates
-- Lock the GCRA rows of these rate limit keys in sorted key order (every claimer locks in this
-- order: no deadlock); returns key, tat and the database's now, as epoch seconds.
SELECT limit_key, extract(epoch FROM tat)::float8 AS tat, extract(epoch FROM clock_timestamp())::float8 AS now
FROM shardq_limit_rate
WHERE limit_key = ANY(%(keys)s::text[])
ORDER BY limit_key
FOR UPDATE;

-- name: claim_limited_jobs
-- The limited claim's writes, in its transaction: make this worker the owner of the slot rows
-- :slot_ids with a lease of :ttl seconds, move each rate key's tat to :rate_tats, and claim the
-- jobs :ids (in claim order) under the shard's current version, only on shards this worker holds.
-- The first :start of them that are unordered, not key_limited and never lost a worker are started at once, as
-- claim_jobs starts them (RUNNING, the attempt counted, started_at, last_attempted_at,
-- worker_ids); the rest are CLAIMED. A job with a :problems entry (what job_problem found in
-- claim_limited_candidates; NULL: none) is quarantined instead, as claim_jobs does. Returns
-- claim_jobs' columns.
WITH slots AS (
    UPDATE shardq_limit_slot AS s
    SET worker_id = %(worker)s::uuid, taken_at = clock_timestamp(),
        expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
    WHERE s.id = ANY(%(slot_ids)s::bigint[])
    RETURNING s.id
), rates AS (
    UPDATE shardq_limit_rate AS r SET tat = to_timestamp(a.tat)
    FROM unnest(%(rate_keys)s::text[], %(rate_tats)s::float8[]) AS a(key, tat)
    WHERE r.limit_key = a.key
    RETURNING r.limit_key
), picked AS MATERIALIZED (
    SELECT job.id, s.claim_version, job.last_attempted_at AS previous_attempt_at, a.problem,
           a.problem IS NULL AND a.ord <= %(start)s AND NOT job.ordered AND NOT job.key_limited
               AND job.worker_losses = 0 AS start_now
    FROM unnest(%(ids)s::bigint[], %(problems)s::text[]) WITH ORDINALITY AS a(id, problem, ord)
    JOIN shardq_job AS job ON job.id = a.id
    JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = job.shard
    WHERE job.status = 'READY' AND s.owner = %(worker)s AND s.lease_expires > clock_timestamp()
)
UPDATE shardq_job AS job
SET {{claim_status_set*}},
    {{claim_start_set*}}
-- slots and rates are written whatever this returns (a data-modifying CTE
-- always runs to completion).
FROM picked
WHERE job.id = picked.id
RETURNING {{claim_returning*}};

-- name: release_limit_slots
-- Give back the slots :slots this worker owns (nothing here needs them) and NOTIFY :channel with
-- each freed key once, so a worker whose limited jobs wait claims them now rather than at its next
-- poll.
WITH freed AS (
    UPDATE shardq_limit_slot
    SET worker_id = NULL, taken_at = NULL, expires_at = NULL
    WHERE worker_id = %(worker)s::uuid AND id = ANY(%(slots)s::bigint[])
    RETURNING limit_key
)
SELECT pg_notify(%(channel)s, key) FROM (SELECT DISTINCT limit_key AS key FROM freed) AS k;

-- name: renew_limit_slots
-- Heartbeat of this worker's slots: extend the lease of those it still owns (:slots, a zombie
-- thread's included) by :ttl seconds, and give back the rest. Returns the slots kept.
UPDATE shardq_limit_slot
SET expires_at = CASE WHEN id = ANY(%(slots)s::bigint[]) THEN clock_timestamp() + make_interval(secs => %(ttl)s) END,
    taken_at = CASE WHEN id = ANY(%(slots)s::bigint[]) THEN taken_at END,
    worker_id = CASE WHEN id = ANY(%(slots)s::bigint[]) THEN worker_id END
WHERE worker_id = %(worker)s::uuid
RETURNING id;

-- name: limit_usage
-- Operator view of every limit key in use or waited on: key, slots owned by workers (lease not
-- expired), holders as a JSON object of worker (name or id) -> slots, READY limited jobs waiting
-- on the key, the rate row's tat (epoch seconds, NULL without one), the database's now, and
-- whether the key is a limit by the shard key (kept in its owner's local queue: no slot rows; in
-- use are its jobs RUNNING, held by the workers running them, waiting its jobs READY or CLAIMED).
WITH waiting AS (
    SELECT k.key, count(*) AS waiting
    -- Shard by shard: each a range of shardq_job_ready_idx's limited jobs.
    FROM (SELECT DISTINCT shard FROM shardq_shard) AS sh
    JOIN shardq_job AS j ON j.shard = sh.shard AND j.status = 'READY' AND (j.limit_keys IS NULL) IS FALSE
    CROSS JOIN LATERAL jsonb_array_elements_text(j.limit_keys) AS k(key)
    GROUP BY k.key
), by_key AS MATERIALIZED (
    -- Limits by the shard key: shardq_job_key_limited_idx holds exactly these rows.
    SELECT 't:' || j.task_path || '=' || j.shard_key AS key, j.status,
           CASE WHEN j.status = 'RUNNING' AND jsonb_typeof(j.worker_ids) = 'array' THEN j.worker_ids ->> -1 END AS worker
    FROM shardq_job AS j
    WHERE j.key_limited AND j.status IN ('READY', 'CLAIMED', 'RUNNING') AND j.shard_key IS NOT NULL
), held AS (
    SELECT s.limit_key AS key, COALESCE(NULLIF(w.name, ''), s.worker_id::text) AS holder, count(*) AS n
    FROM shardq_limit_slot AS s LEFT JOIN shardq_worker AS w ON w.id = s.worker_id
    WHERE s.worker_id IS NOT NULL AND s.expires_at > clock_timestamp()
    GROUP BY 1, 2
    UNION ALL
    SELECT b.key, COALESCE(NULLIF(w.name, ''), b.worker, '?') AS holder, count(*) AS n
    FROM by_key AS b LEFT JOIN shardq_worker AS w ON w.id::text = b.worker
    WHERE b.status = 'RUNNING'
    GROUP BY 1, 2
), keys AS (
    SELECT key FROM waiting UNION SELECT key FROM held
    UNION SELECT limit_key FROM shardq_limit_rate
    UNION SELECT DISTINCT limit_key FROM shardq_limit_slot
    UNION SELECT key FROM by_key
)
SELECT keys.key,
       COALESCE((SELECT sum(n) FROM held WHERE held.key = keys.key), 0)::int AS in_use,
       COALESCE((SELECT jsonb_object_agg(holder, n) FROM held WHERE held.key = keys.key), '{}'::jsonb) AS holders,
       (COALESCE((SELECT waiting FROM waiting WHERE waiting.key = keys.key), 0)
        + (SELECT count(*) FROM by_key AS b WHERE b.key = keys.key AND b.status <> 'RUNNING'))::int AS waiting,
       (SELECT extract(epoch FROM tat)::float8 FROM shardq_limit_rate AS r WHERE r.limit_key = keys.key) AS tat,
       extract(epoch FROM clock_timestamp())::float8 AS now,
       EXISTS (SELECT 1 FROM by_key AS b WHERE b.key = keys.key) AS by_shard_key
FROM keys
ORDER BY keys.key;
