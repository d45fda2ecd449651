-- shardq_job_history: finished jobs moved out of shardq_job (docs/architecture.md, "History"),
-- partitioned by finished_at; the archiver's move, its partitions, and the reads that look there too.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: archivable
-- The finished jobs that leave shardq_job (a WHERE fragment over an unqualified shardq_job row,
-- included bare): SUCCESSFUL, and FAILED by a cancel. Dead letters (FAILED otherwise) stay: they
-- are the operator's work items (retry, discard), read and acted on in the hot table. Word for word
-- the predicate of shardq_job_archivable_idx (migration 0022): the planner uses that partial index
-- only for a query that repeats it.
(status = 'SUCCESSFUL'
       OR (status = 'FAILED' AND errors -> -1 ->> 'exception_class_path' = 'shardq.exceptions.Cancelled'))

-- name: archive_jobs
-- The archiver's move: up to :batch archivable jobs that finished more than :grace seconds ago and
-- before :ceiling (the end of the newest partition), oldest first over shardq_job_archivable_idx,
-- leave shardq_job for shardq_job_history in one statement (DELETE ... RETURNING into INSERT: a job
-- is in exactly one of the two tables for every snapshot). A job that finished before :floor (the
-- start of the oldest partition kept: past the retention already) is deleted, not moved. Never a
-- workflow parent whose children the resolver has not moved on yet, or one with a WAITING child
-- (as shardq_prune). Returns how many left shardq_job and how many of them were written to history.
-- The INSERT is positional (SELECT *): the two tables have the same columns in the same order
-- (migration 0022, shardq.db.store.sync_history_columns, and a test that checks it).
WITH picked AS MATERIALIZED (
    SELECT id FROM shardq_job AS j
    WHERE {{archivable*}}
      AND j.finished_at < LEAST(clock_timestamp() - make_interval(secs => %(grace)s), %(ceiling)s::timestamptz)
      AND NOT j.children_pending
      AND NOT EXISTS (SELECT 1 FROM shardq_edge AS e JOIN shardq_job AS c ON c.id = e.child
                      WHERE e.parent = j.id AND c.status = 'WAITING')
    ORDER BY j.finished_at
    LIMIT %(batch)s
    -- A row another transaction holds (an admin action, a prune) is left for the next pass.
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM shardq_job AS j USING picked WHERE j.id = picked.id
    RETURNING j.*
), kept AS (
    INSERT INTO shardq_job_history SELECT * FROM moved WHERE moved.finished_at >= %(floor)s::timestamptz
    RETURNING 1
), edges AS (
    -- A job deleted here (past the retention) takes its edges to its parents with it, as prune does.
    DELETE FROM shardq_edge AS e USING moved
    WHERE e.child = moved.id AND moved.finished_at < %(floor)s::timestamptz
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM kept);

-- name: history_partitions
-- The partitions of shardq_job_history, oldest first: name, the finish times it holds [low, high),
-- and the planner's estimate of its rows (reltuples; -1 before its first ANALYZE). The bounds are
-- read back from the catalog's partition bound, so a partition made by hand counts too.
SELECT c.relname::text AS name,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz AS low,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz AS high,
       c.reltuples::bigint AS estimated_rows
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'shardq_job_history'::regclass
ORDER BY low NULLS FIRST;

-- name: history_create_partitions
-- The DDL that creates the partitions missing to cover finish times from :keep seconds ago to
-- :ahead seconds from now, each :width seconds aligned on the epoch (a day: UTC midnight), named
-- shardq_job_history_YYYYMMDD_HHMMSS by its start (UTC); one statement a row, for the caller to run.
-- A span that overlaps a partition already there (made under another width) is left to it.
WITH span AS (
    SELECT to_timestamp(s) AS low, to_timestamp(s + %(width)s) AS high
    FROM generate_series(
        (floor(extract(epoch FROM clock_timestamp() - make_interval(secs => %(keep)s)) / %(width)s) * %(width)s)::bigint,
        (floor(extract(epoch FROM clock_timestamp() + make_interval(secs => %(ahead)s)) / %(width)s) * %(width)s)::bigint,
        %(width)s::bigint) AS s
), existing AS (
    {{history_partitions*}}
)
SELECT format('CREATE TABLE IF NOT EXISTS %%I PARTITION OF shardq_job_history FOR VALUES FROM (%%L) TO (%%L)',
              'shardq_job_history_' || to_char(span.low AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS'),
              span.low, span.high)
FROM span
WHERE NOT EXISTS (SELECT 1 FROM existing AS x WHERE x.low < span.high AND x.high > span.low)
ORDER BY span.low;

-- name: history_expired_partitions
-- The partitions of shardq_job_history whose every finish time is more than :keep seconds ago:
-- name, and the two statements that drop it (DETACH ... CONCURRENTLY takes no lock that waits for
-- the readers of the other partitions, then DROP TABLE; neither leaves dead rows to vacuum), for the
-- caller to run outside a transaction. A partition left half-detached by an earlier try is
-- finished first.
WITH p AS ({{history_partitions*}})
SELECT p.name,
       format(CASE WHEN i.inhdetachpending THEN 'ALTER TABLE shardq_job_history DETACH PARTITION %%I FINALIZE'
                   ELSE 'ALTER TABLE shardq_job_history DETACH PARTITION %%I CONCURRENTLY' END, p.name) AS detach,
       format('DROP TABLE %%I', p.name) AS drop
FROM p
JOIN pg_class AS c ON c.relname = p.name
JOIN pg_inherits AS i ON i.inhrelid = c.oid AND i.inhparent = 'shardq_job_history'::regclass
WHERE p.high <= clock_timestamp() - make_interval(secs => %(keep)s)
ORDER BY p.low;

-- name: history_column_drift
-- The columns of shardq_job that shardq_job_history lacks or holds at another place or of another
-- type (the archiver's INSERT ... SELECT * is positional): name, its type in each table (NULL:
-- missing there), its place in each. Empty: the two match.
WITH hot AS (
    SELECT attname, format_type(atttypid, atttypmod) AS type, row_number() OVER (ORDER BY attnum) AS place
    FROM pg_attribute WHERE attrelid = 'shardq_job'::regclass AND attnum > 0 AND NOT attisdropped
), history AS (
    SELECT attname, format_type(atttypid, atttypmod) AS type, row_number() OVER (ORDER BY attnum) AS place
    FROM pg_attribute WHERE attrelid = 'shardq_job_history'::regclass AND attnum > 0 AND NOT attisdropped
)
SELECT COALESCE(hot.attname, history.attname)::text AS name, hot.type AS hot_type, history.type AS history_type,
       hot.place AS hot_place, history.place AS history_place
FROM hot FULL JOIN history ON history.attname = hot.attname
WHERE hot.type IS DISTINCT FROM history.type OR hot.place IS DISTINCT FROM history.place
ORDER BY COALESCE(hot.place, history.place);

-- name: history_add_missing_columns
-- The DDL that adds to shardq_job_history each column of shardq_job it lacks, with its type, in
-- shardq_job's order (appended: a column appended to shardq_job lands at the same place); one
-- statement a row (run by shardq.db.store.sync_history_columns after migrate).
SELECT format('ALTER TABLE shardq_job_history ADD COLUMN %%I %%s', a.attname, format_type(a.atttypid, a.atttypmod))
FROM pg_attribute AS a
WHERE a.attrelid = 'shardq_job'::regclass AND a.attnum > 0 AND NOT a.attisdropped
  AND NOT EXISTS (SELECT 1 FROM pg_attribute AS h
                  WHERE h.attrelid = 'shardq_job_history'::regclass AND h.attname = a.attname AND NOT h.attisdropped)
ORDER BY a.attnum;

-- name: restore_history_jobs
-- Put the jobs of :ids that are in shardq_job_history back into shardq_job (a finished job named as
-- a parent by a new workflow step: link_parents then marks it, and the resolver moves the new
-- children on from it as from any finished parent; the archiver moves it out again later).
-- Returns the ids restored.
WITH back AS (
    DELETE FROM shardq_job_history WHERE id = ANY(%(ids)s::bigint[])
    RETURNING *
)
INSERT INTO shardq_job SELECT * FROM back
RETURNING id;

-- name: job_anywhere
-- Job :id's row wherever it is (a subquery of every column, at most one row): shardq_job first,
-- then shardq_job_history. The Append stops at its first row, so a job still in shardq_job costs
-- no probe of the history's partitions. One statement, one snapshot: the archiver's move is one
-- statement too, so a job is seen in exactly one of the two.
SELECT * FROM (
    SELECT * FROM shardq_job WHERE id = %(id)s
    UNION ALL
    SELECT * FROM shardq_job_history WHERE id = %(id)s
) AS anywhere LIMIT 1

-- name: history_estimate
-- shardq_status and the admin: rows in shardq_job_history by the planner's estimate (no count(*)
-- of millions of rows), its partitions, and the finish times they cover.
SELECT COALESCE(sum(GREATEST(p.estimated_rows, 0)), 0)::bigint, count(*)::int, min(p.low), max(p.high)
FROM ({{history_partitions*}}) AS p;

-- name: history_gauges
-- The metrics' history gauges: estimated rows, partitions, and the seconds since the oldest
-- partition's start (NULL when no partition has a finite start: none, or one made by hand FROM
-- MINVALUE or '-infinity').
SELECT COALESCE(sum(GREATEST(p.estimated_rows, 0)), 0)::bigint, count(*)::int,
       extract(epoch FROM clock_timestamp() - min(p.low) FILTER (WHERE isfinite(p.low)))::float8
FROM ({{history_partitions*}}) AS p;

-- name: history_present
-- Whether shardq_job and shardq_job_history both exist (post_migrate runs after a migrate to an
-- earlier state too).
SELECT to_regclass('shardq_job') IS NOT NULL AND to_regclass('shardq_job_history') IS NOT NULL
