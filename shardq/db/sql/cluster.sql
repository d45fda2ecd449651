-- shardq_cluster: the shard count and online resharding (docs/scaling.md).
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: shard_count_now
-- The cluster's shard count (shardq_cluster, changed by shardq_reshard), or :shard_count
-- (SHARDQ["SHARD_COUNT"]) when the row is missing: an expression. Read in the statement that uses
-- it, so an enqueue places its job with the count current when it runs, with no round trip of its
-- own.
COALESCE((SELECT c.shard_count FROM shardq_cluster AS c WHERE c.id = 1), %(shard_count)s)

-- name: tables_present
-- Touches every table a worker uses and reads no row: fails with undefined_table (42P01) before
-- manage.py migrate (shardq_worker's check before it starts).
SELECT 1 FROM shardq_cluster, shardq_shard, shardq_worker, shardq_job LIMIT 0;

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
SELECT (SELECT count(*) FROM shardq_job WHERE status IN ('READY', 'WAITING', 'SUSPENDED') AND shard <> key_hash & (%(to)s - 1)),
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
    WHERE shard = %(shard)s AND status IN ('READY', 'WAITING', 'SUSPENDED') AND shard <> key_hash & (%(to)s - 1)
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
        WHERE status IN ('READY', 'WAITING', 'SUSPENDED') AND shard <> key_hash & (%(to)s - 1)),
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
