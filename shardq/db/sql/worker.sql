-- shardq_worker: registration, heartbeat, liveness, pruning.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: register_worker
-- Register a worker incarnation (a fresh UUID every start) of pool :pool and its readable name
-- (--worker-id, '' for none), with its lease session's identity (backend_identity).
INSERT INTO shardq_worker (id, host, pid, queues, pool, started_at, heartbeat_at, state, stats, name,
                           backend_pid, backend_start, server_started)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(pool)s, clock_timestamp(), clock_timestamp(),
        'RUNNING', '{}'::jsonb, %(name)s, {{backend_identity*}});

-- name: backend_identity
-- Dead-owner detection (docs/reliability.md, "A worker that dies"): the identity of this session,
-- as register_worker and heartbeat record it (a list of three values: backend_pid, backend_start,
-- server_started). :client_pid is the backend pid the client was told at connect time
-- (psycopg's info.backend_pid), NULL when detection is off for this worker. A pooler in between
-- (PgBouncer, any mode) tells the client a pid of its own, so the two differ and nothing is
-- recorded: a worker is only ever taken for dead by the session it really holds.
CASE WHEN %(client_pid)s::int = pg_backend_pid() THEN pg_backend_pid() END,
CASE WHEN %(client_pid)s::int = pg_backend_pid()
     THEN (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) AS a) END,
CASE WHEN %(client_pid)s::int = pg_backend_pid() THEN pg_postmaster_start_time() END

-- name: record_listener
-- Dead-owner detection: the worker's LISTEN session (listener.py, at each connect), recorded beside
-- its lease session, on the same server only (server_started, as the lease session recorded it) and
-- only when the client was told this backend's pid (no pooler between: backend_identity).
UPDATE shardq_worker
SET listener_pid = CASE WHEN %(client_pid)s::int = pg_backend_pid() AND server_started = pg_postmaster_start_time()
                        THEN pg_backend_pid() END,
    listener_start = CASE WHEN %(client_pid)s::int = pg_backend_pid() AND server_started = pg_postmaster_start_time()
                          THEN (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) AS a) END
WHERE id = %(worker)s;

-- name: backend_gone
-- Dead-owner detection: is the lease session recorded in the shardq_worker row w gone from this
-- server? Only for an identity recorded on this very server (a pid of another server, before a
-- failover or a restart, is never looked up here); gone when no backend has its pid, or one has
-- it with another start (the pid was reused). A backend start we may not see (another role without
-- pg_read_all_stats) counts as the same: when in doubt the owner is alive and its leases expire
-- as they always did. pg_stat_get_activity(pid) builds the one row of that pid.
w.backend_pid IS NOT NULL AND w.server_started = pg_postmaster_start_time()
AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(w.backend_pid) AS a
                WHERE a.pid = w.backend_pid
                  AND (a.backend_start IS NULL OR w.backend_start IS NULL OR a.backend_start = w.backend_start))

-- name: dead_owners
-- Dead-owner detection's check (every DEAD_OWNER_CHECK seconds on each worker's lease connection):
-- the other workers of pool :pool, not stopped, heartbeat within :ttl, whose lease session is gone
-- (backend_gone): id, the recorded pid, whether it still holds a live lease of the pool, and whether
-- its LISTEN session (record_listener) is recorded (and so gone too: the whole process is gone).
-- A peer whose LISTEN session is recorded and still there is alive, whatever its lease session
-- did (a dropped connection it is reconnecting): it is not listed, and its leases expire as ever.
SELECT w.id::text, w.backend_pid,
       EXISTS (SELECT 1 FROM shardq_shard AS s
               WHERE s.pool = %(pool)s AND s.owner = w.id AND s.lease_expires > clock_timestamp()),
       w.listener_pid IS NOT NULL
FROM shardq_worker AS w
WHERE w.pool = %(pool)s AND w.state <> 'STOPPED' AND w.id <> %(worker)s AND w.backend_pid IS NOT NULL
  AND w.heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)
  AND {{backend_gone}}
  AND (w.listener_pid IS NULL
       OR NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(w.listener_pid) AS a
                      WHERE a.pid = w.listener_pid
                        AND (a.backend_start IS NULL OR w.listener_start IS NULL
                             OR a.backend_start = w.listener_start)));

-- name: heartbeat
-- Record this worker's heartbeat and counters; list the live workers of its pool (heartbeat within
-- the TTL, this one included) in a stable order: they share the pool's shards. Each row also
-- carries the cluster's shard count (NULL: no cluster row), which shardq_reshard may have raised.
-- The workers named in :dead (the leaser's dead-owner check saw their lease session gone for two
-- intervals) are not counted while their session is still gone (backend_gone): the survivors' shares
-- grow at once and they claim the dead worker's shards. The heartbeat also records this session's
-- identity (backend_identity).
WITH me AS (
    UPDATE shardq_worker SET heartbeat_at = {{now}}, stats = %(stats)s::jsonb,
        (backend_pid, backend_start, server_started) = ({{backend_identity*}}),
        -- A LISTEN session recorded on another server (before a failover) is forgotten.
        listener_pid = CASE WHEN server_started = pg_postmaster_start_time() THEN listener_pid END
    WHERE id = %(worker)s
    RETURNING id
)
SELECT w.id, (SELECT count(*) FROM me), (SELECT c.shard_count FROM shardq_cluster AS c WHERE c.id = 1)
FROM shardq_worker w
WHERE w.state = 'RUNNING' AND w.pool = %(pool)s
  AND (w.id = %(worker)s
       OR (w.heartbeat_at > {{now}} - make_interval(secs => %(ttl)s)
           AND NOT (w.id = ANY(%(dead)s::uuid[]) AND {{backend_gone}})))
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
