-- shardq_worker: registration, heartbeat, liveness, pruning.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

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
    UPDATE shardq_worker SET heartbeat_at = {{now}}, stats = %(stats)s::jsonb
    WHERE id = %(worker)s
    RETURNING id
)
SELECT w.id, (SELECT count(*) FROM me), (SELECT c.shard_count FROM shardq_cluster AS c WHERE c.id = 1)
FROM shardq_worker w
WHERE w.state = 'RUNNING' AND w.pool = %(pool)s
  AND (w.heartbeat_at > {{now}} - make_interval(secs => %(ttl)s) OR w.id = %(worker)s)
ORDER BY w.started_at, w.id;

-- name: stop_worker
-- Mark a worker incarnation stopped and store its final counters.
UPDATE shardq_worker SET state = 'STOPPED', heartbeat_at = clock_timestamp(), stats = %(stats)s::jsonb
WHERE id = %(worker)s;

-- name: prune_workers
-- Delete worker incarnations whose last heartbeat is older than :cutoff and that own no shard;
-- returns how many.
WITH gone AS (
    DELETE FROM shardq_worker AS w WHERE w.heartbeat_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM shardq_shard AS s WHERE s.owner = w.id)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: count_prunable_rest
-- What prune_unique_keys, prune_workers and prune_shard_events would delete (for --dry-run).
SELECT (SELECT count(*) FROM shardq_unique WHERE expires_at < clock_timestamp()),
       (SELECT count(*) FROM shardq_worker AS w WHERE w.heartbeat_at < %(cutoff)s
          AND NOT EXISTS (SELECT 1 FROM shardq_shard AS s WHERE s.owner = w.id)),
       (SELECT count(*) FROM shardq_shard_event WHERE at < %(cutoff)s);

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
