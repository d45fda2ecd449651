-- shardq_limit_slot and shardq_limit_rate: concurrency and rate limits (docs/limits.md).
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

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
    WHERE shard = h.shard AND status = 'READY' AND (limit_keys IS NULL) IS FALSE AND {{fair_column}} IS FALSE
      -- Due now, no look-ahead: a rate token is spent when the job is claimed.
      AND run_after <= {{now}}
      AND NOT (limit_keys ?| %(full)s::text[])
      AND {{served_jobs*}}
      -- An ordered key whose job is suspended: its other jobs wait (claim_key_free).
      AND NOT (ordered AND EXISTS (
          SELECT 1 FROM shardq_job AS z
          WHERE z.shard = h.shard AND z.shard_key = shardq_job.shard_key AND z.ordered AND z.status = 'SUSPENDED'))
    ORDER BY priority DESC, run_after, id
    LIMIT %(per_shard)s
    FOR UPDATE SKIP LOCKED
) AS j
WHERE s.owner = %(worker)s AND s.lease_expires > {{now}}
ORDER BY j.priority DESC, j.run_after, j.id
LIMIT %(scan)s;

-- name: claim_limited_owned
-- The limited claim in one statement, for the jobs this worker already owns slots for (no slot to
-- take, no rate to debit): walk up to :per_shard due READY limited jobs of each shard it holds,
-- in claim order, FOR UPDATE SKIP LOCKED, passing over (without a lock) jobs with a key not in
-- :keys (a limit it owns no room of, or a rate limit); take, in claim order, the ones every key
-- of has room (:rooms, one per key of :keys; a job's place among a key's candidates counts
-- against that key's room, so no key gets more than its room), :limit in all, under each shard's
-- current claim version, CLAIMED (started by their threads, never by this claim). Same queue and
-- backend filters as claim_jobs. A row job_problem finds unreadable among those walked is
-- quarantined, as claim_jobs does. Returns claim_jobs' columns.
WITH held AS MATERIALIZED (
    SELECT s.shard, s.claim_version
    FROM unnest(%(shards)s::int[]) AS h(shard)
    JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = h.shard
    WHERE s.owner = %(worker)s AND s.lease_expires > {{now}}
), candidates AS MATERIALIZED (
    SELECT j.id, j.limit_keys, j.problem, j.ordered, j.key_limited, j.worker_losses, j.last_attempted_at,
           held.claim_version, row_number() OVER (ORDER BY j.priority DESC, j.run_after, j.id) AS place
    FROM held
    CROSS JOIN LATERAL (
        SELECT id, limit_keys, ordered, key_limited, worker_losses, last_attempted_at, priority, run_after,
               {{job_problem}} AS problem
        FROM shardq_job
        -- (limit_keys IS NULL) IS FALSE: shardq_job_ready_idx's limited range (as claim_limited_candidates).
        WHERE shard = held.shard AND status = 'READY' AND (limit_keys IS NULL) IS FALSE AND {{fair_column}} IS FALSE
          AND run_after <= {{now}}
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
    SELECT c.id, c.claim_version, c.last_attempted_at AS previous_attempt_at, c.problem, false AS start_now
    FROM candidates AS c LEFT JOIN fits ON fits.id = c.id
    WHERE fits.id IS NOT NULL OR c.problem IS NOT NULL
    ORDER BY c.place
    LIMIT %(limit)s
)
UPDATE shardq_job AS job
SET {{claim_status_set*}},
    {{claim_fence_set*}}
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
    WHERE limit_key = k.key AND slot < k.cap AND (worker_id IS NULL OR expires_at < {{now}})
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
SELECT limit_key, extract(epoch FROM tat)::float8 AS tat, extract(epoch FROM {{now}})::float8 AS now
FROM shardq_limit_rate
WHERE limit_key = ANY(%(keys)s::text[])
ORDER BY limit_key
FOR UPDATE;

-- name: claim_limited_jobs
-- The limited claim's writes, in its transaction: make this worker the owner of the slot rows
-- :slot_ids with a lease of :ttl seconds, move each rate key's tat to :rate_tats, and claim the
-- jobs :ids (in claim order) under the shard's current version, only on shards this worker holds.
-- Those of :start_ids (jobs limited by rates alone, claimed for threads idle now: the claim spends
-- their tokens, and starts them, so a rate limit holds on starts) that are unordered, not
-- key_limited and never lost a worker are started at once (RUNNING, the attempt counted,
-- started_at, last_attempted_at, worker_ids); the rest are CLAIMED, started by their threads.
-- A job with a :problems entry (what job_problem found in claim_limited_candidates; NULL: none)
-- is quarantined instead, as claim_jobs does. Returns claim_jobs' columns.
WITH slots AS (
    UPDATE shardq_limit_slot AS s
    SET worker_id = %(worker)s::uuid, taken_at = {{now}},
        expires_at = {{now}} + make_interval(secs => %(ttl)s)
    WHERE s.id = ANY(%(slot_ids)s::bigint[])
    RETURNING s.id
), rates AS (
    UPDATE shardq_limit_rate AS r SET tat = to_timestamp(a.tat)
    FROM unnest(%(rate_keys)s::text[], %(rate_tats)s::float8[]) AS a(key, tat)
    WHERE r.limit_key = a.key
    RETURNING r.limit_key
), picked AS MATERIALIZED (
    SELECT job.id, s.claim_version, job.last_attempted_at AS previous_attempt_at, a.problem,
           a.problem IS NULL AND job.id = ANY(%(start_ids)s::bigint[]) AND NOT job.ordered AND NOT job.key_limited
           AND job.worker_losses = 0 AS start_now
    FROM unnest(%(ids)s::bigint[], %(problems)s::text[]) WITH ORDINALITY AS a(id, problem, ord)
    JOIN shardq_job AS job ON job.id = a.id
    JOIN shardq_shard AS s ON s.pool = %(pool)s AND s.shard = job.shard
    WHERE job.status = 'READY' AND s.owner = %(worker)s AND s.lease_expires > {{now}}
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
SET expires_at = CASE WHEN id = ANY(%(slots)s::bigint[]) THEN {{now}} + make_interval(secs => %(ttl)s) END,
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
        AND (j.fair_key IS NOT NULL AND j.limit_keys IS NULL) IS FALSE
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
