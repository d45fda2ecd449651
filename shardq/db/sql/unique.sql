-- shardq_unique: the keys of unique jobs.
-- Named blocks, loaded by shardq/db/queries.py (its docstring says how they are written).

-- name: release_unique_key
-- Free :unique_key when its holder is :job_id, a job that no longer exists (deleted or pruned
-- inside the key's TTL): in neither shardq_job nor shardq_job_history (a job moved there still
-- holds its key for the rest of the window).
DELETE FROM shardq_unique WHERE key = %(unique_key)s AND job_id = %(job_id)s
  AND NOT EXISTS (SELECT 1 FROM shardq_job WHERE id = %(job_id)s)
  AND NOT EXISTS (SELECT 1 FROM shardq_job_history WHERE id = %(job_id)s);

-- name: prune_unique_keys
-- Delete up to :batch expired unique keys (an expired key holds nothing: the next enqueue of it
-- would take it over); returns how many.
WITH gone AS (
    DELETE FROM shardq_unique WHERE key IN (
        SELECT key FROM shardq_unique WHERE expires_at < clock_timestamp() LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;
