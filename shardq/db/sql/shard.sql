-- shardq_shard and shardq_shard_event: the lease protocol (DESIGN §4) and its log.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

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

-- name: claim_shards
-- Take up to :wanted unowned or expired shards of pool :pool (SKIP LOCKED), each under a new
-- claim_version from the one sequence; returns shard, claim_version, previous owner. The store
-- then runs rescue_jobs and log_shard_claims in the same transaction. A shard whose owner is in
-- :dead (the dead-owner check saw its lease session gone) and whose session is still gone
-- (backend_gone, looked at again here) is taken like an expired one: the new claim_version fences
-- the old owner exactly as an expiry does, should it be alive after all.
WITH candidate AS (
    SELECT id, shard, owner FROM shardq_shard AS s
    WHERE pool = %(pool)s AND shard < %(shard_count)s
      AND (owner IS NULL OR lease_expires < {{now}}
           OR (owner = ANY(%(dead)s::uuid[])
               AND EXISTS (SELECT 1 FROM shardq_worker AS w WHERE w.id = s.owner AND {{backend_gone}})))
    ORDER BY shard
    LIMIT %(wanted)s
    FOR UPDATE SKIP LOCKED
)
UPDATE shardq_shard AS s
SET owner = %(worker)s, claim_version = nextval('shardq_claim_version_seq'),
    lease_expires = {{now}} + make_interval(secs => %(ttl)s),
    claimed_at = {{now}}
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
SET lease_expires = {{now}} + make_interval(secs => %(ttl)s)
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

-- name: log_shard_claims
-- Log each shard claim (a takeover when it had an owner) with how many jobs its rescue moved.
INSERT INTO shardq_shard_event (pool, shard, claim_version, worker, reason, rescued, at)
SELECT %(pool)s, c.shard, c.version, %(worker)s, CASE WHEN c.previous IS NULL THEN 'claim' ELSE 'takeover' END,
       c.rescued, clock_timestamp()
FROM unnest(%(shards)s::int[], %(versions)s::bigint[], %(previous)s::text[], %(rescued)s::int[])
     AS c(shard, version, previous, rescued);

-- name: prune_shard_events
-- Delete shard claim/release history older than :cutoff; returns how many rows.
WITH gone AS (
    DELETE FROM shardq_shard_event WHERE at < %(cutoff)s RETURNING 1
)
SELECT count(*) FROM gone;

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

-- name: metrics_unowned_shards
-- The cluster gauge of shards unowned or expired, summed over the pools that have a live worker
-- (heartbeat within :ttl); a pool nobody runs any more is not counted.
SELECT count(*) FROM shardq_shard AS s
WHERE s.shard < {{shard_count_now}} AND (s.owner IS NULL OR s.lease_expires <= clock_timestamp())
  AND EXISTS (SELECT 1 FROM shardq_worker AS w
              WHERE w.pool = s.pool AND w.state = 'RUNNING'
                AND w.heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s));
