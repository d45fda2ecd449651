-- shardq_queue_control: live queue controls (docs/operations.md, "Queue controls").
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: queue_controls
-- What workers obey: every queue paused or with a concurrency override. Read by each worker's
-- fetcher on a NOTIFY on <CHANNEL>_queue and at every poll interval (a small table: one row a
-- queue an operator ever touched).
SELECT queue_name, paused, concurrency
FROM shardq_queue_control
WHERE paused OR concurrency IS NOT NULL
ORDER BY queue_name;

-- name: queue_control_report
-- Every row, for the admin's Queues page and shardq_status, with who changed it last and when.
SELECT queue_name, paused, concurrency, updated_at, updated_by
FROM shardq_queue_control
ORDER BY queue_name;

-- name: set_queue_paused
-- Pause (:paused true) or resume a queue, creating its row on first use, and tell every worker
-- (the NOTIFY goes out at commit; its payload is only a wake-up, workers read the table). Returns
-- whether the state changed.
WITH old AS (
    SELECT paused FROM shardq_queue_control WHERE queue_name = %(queue)s
), up AS (
    INSERT INTO shardq_queue_control AS c (queue_name, paused, concurrency, updated_at, updated_by)
    VALUES (%(queue)s, %(paused)s, NULL, clock_timestamp(), %(by)s)
    ON CONFLICT (queue_name) DO UPDATE
    SET paused = excluded.paused, updated_at = excluded.updated_at, updated_by = excluded.updated_by
    RETURNING c.queue_name
)
SELECT pg_notify(%(channel)s, up.queue_name), coalesce((SELECT paused FROM old), false) IS DISTINCT FROM %(paused)s
FROM up;

-- name: set_queue_concurrency
-- Set (:concurrency a count) or clear (NULL) a queue's concurrency override, creating its row on
-- first use, and tell every worker (NOTIFY at commit).
WITH up AS (
    INSERT INTO shardq_queue_control AS c (queue_name, paused, concurrency, updated_at, updated_by)
    VALUES (%(queue)s, false, %(concurrency)s, clock_timestamp(), %(by)s)
    ON CONFLICT (queue_name) DO UPDATE
    SET concurrency = excluded.concurrency, updated_at = excluded.updated_at, updated_by = excluded.updated_by
    RETURNING c.queue_name
)
SELECT pg_notify(%(channel)s, up.queue_name) FROM up;
