-- Statements on no table: NOTIFY, session settings, advisory locks, the database's clock.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: notify
-- Send one NOTIFY (a lease announcement; enqueue NOTIFYs ride on their INSERT).
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: async_commit
-- Commit this session's writes without waiting for the WAL flush (the claim and start connections:
-- a lost claim or start leaves its jobs READY or CLAIMED, never a wrong outcome).
SET synchronous_commit = off;

-- name: generic_plans
-- Plan each prepared statement of this session once (the start and ack connections): their
-- statements are primary-key writes driven by id arrays, whose plan the values never change,
-- and under plan_cache_mode's default PostgreSQL planned the start write afresh at every call
-- (its cost estimate for the generic plan, ten ids an array, lost to the custom plan's for the
-- few a group holds): the planning took more of the server's CPU than the write itself
-- (docs/benchmarks.md, "The database's share of a job").
SET plan_cache_mode = force_generic_plan;

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

-- name: now
-- The time a lease or due-time statement reads (an expression): :now when given, else the
-- database's clock_timestamp(). The worker passes None; a test passes a time to jump past a
-- lease's end or a job's run_after instead of waiting for it.
COALESCE(%(now)s::timestamptz, clock_timestamp())

-- name: flush_commits
-- A synchronous commit that writes WAL (a transactional logical message, prefix shardq_ack_flush,
-- empty; a logical decoding consumer may see it and skip it): it returns once the WAL is flushed
-- past every commit this server made before it, the start writes' asynchronous ones among them
-- (and the outcomes that rode on those: the completer's ack flush, worker/completer.py). A
-- transaction id alone writes no WAL, and its commit waits for no flush.
SELECT pg_logical_emit_message(true, 'shardq_ack_flush', '')::text;

-- name: set_lock_timeout
-- How long this session's statements wait for a lock (:ms, text), until changed: the history's
-- partition DDL gives up rather than queue the readers of shardq_job_history behind it.
SELECT set_config('lock_timeout', %(ms)s, false);

-- name: jit_off
-- JIT compilation off for this session (the admin's pages: shardq.admin.common.without_jit). The
-- planner costs a statement over shardq_job_history before run-time pruning drops all but a few of
-- its partitions, above jit_above_cost, and compiling took seconds for milliseconds of work.
SET jit = off

-- name: jit_reset
-- The session's JIT setting back to the server's (after jit_off).
RESET jit

-- name: ordered_walks
-- No bitmap scans on this session (the claim connections): the claim walks each shard's slice of
-- shardq_job_ready_idx in claim order and stops at its batch. Its prepared statement runs on a
-- generic plan after five executions, and there, not knowing :min_priority, :lookahead or the
-- batch, the planner estimated a shard's slice at one row and chose a bitmap scan of the whole
-- slice and a sort, at every claim: the backlog read and sorted once per claim (1.2 s a claim at
-- 40,000 READY jobs, 12 ms walked; docs/benchmarks.md, "The database's share of a job").
SET enable_bitmapscan = off;

-- name: show_plan_cache_mode
-- This session's plan_cache_mode (generic_plans sets it: the tests read it back).
SHOW plan_cache_mode;

-- name: show_enable_bitmapscan
-- This session's enable_bitmapscan (ordered_walks sets it: the tests read it back).
SHOW enable_bitmapscan;
