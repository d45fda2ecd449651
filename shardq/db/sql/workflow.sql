-- shardq_edge: workflows, jobs that wait for other jobs (docs/workflows.md).
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

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
-- A job's parents (context.parent_results): the edge's name, then every column get_job returns;
-- a parent moved to shardq_job_history is read there (a parent leaves the hot table only once
-- every child of it has been moved on: archive_jobs).
SELECT e.name AS step_name, j.id, j.task_path, j.backend, j.queue_name, j.priority, j.run_after, j.status, j.args, j.kwargs,
       j.return_value, j.errors, j.worker_ids, j.enqueued_at, j.started_at, j.finished_at, j.last_attempted_at
FROM shardq_edge AS e
CROSS JOIN LATERAL (
    SELECT * FROM (SELECT * FROM shardq_job WHERE id = e.parent
                   UNION ALL
                   SELECT * FROM shardq_job_history WHERE id = e.parent) AS anywhere
    LIMIT 1
) AS j
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
