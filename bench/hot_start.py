"""What the start write would cost as a HOT update: an experiment on a
scratch copy of shardq_job, not a change of the status model.

    nice -n -10 .venv/bin/python bench/hot_start.py [--jobs 20000] [--rounds 3] [--group 4]

On a PostgreSQL cluster of its own (tests/pgserver.py), a database migrated
by this checkout: ``--jobs`` CLAIMED rows of a no-op task, then every one of
them started in groups of ``--group`` (one statement a group from one
connection in autocommit, as the worker's start writes go), two ways,
alternated round by round:

- **today**: start_jobs' SET list: status CLAIMED -> RUNNING, the attempt
  counted, the start times and the worker's id. status is in the predicate
  of partial indexes (shardq_job_inflight_idx, shardq_job_kwargs_idx, ...)
  and attempts in the dead-letter ones', so the update is never HOT: a new
  entry in every index the new version matches.
- **hot**: the same row writes, but status and attempts unchanged (what a
  start would write if "started" and the attempt count lived in columns no
  index reads): PostgreSQL may then write a heap-only tuple, no index entry.

Per start: the backend's CPU (/proc), the statement's wall time, and the
share of updates that were HOT (pg_stat_user_tables). Prints the medians
and hot ÷ today.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TICK = os.sysconf("SC_CLK_TCK")

FILL = """
INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, shard_key, ordered,
    status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at)
SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 0, t, h & 63, h, NULL, false, 'CLAIMED', 1, 1, 0, 1,
       '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, t
FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, clock_timestamp() AS t
      FROM generate_series(1, %s)) AS g
"""
TODAY = """
UPDATE shardq_job AS job
SET status = 'RUNNING', status_rank = job.status_rank + 1, attempts = job.attempts + 1,
    started_at = COALESCE(job.started_at, clock_timestamp()), last_attempted_at = clock_timestamp(),
    worker_ids = job.worker_ids || jsonb_build_array('w'::text)
WHERE job.id = ANY(%s::bigint[])
"""
HOT = """
UPDATE shardq_job AS job
SET status_rank = job.status_rank + 1,
    started_at = COALESCE(job.started_at, clock_timestamp()), last_attempted_at = clock_timestamp(),
    worker_ids = job.worker_ids || jsonb_build_array('w'::text)
WHERE job.id = ANY(%s::bigint[])
"""


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one(url: str, statement: str, jobs: int, group: int) -> dict:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shardq_job")
        conn.execute(FILL, [jobs])
        conn.execute("VACUUM ANALYZE shardq_job")
        conn.execute("CHECKPOINT")
        ids = [r[0] for r in conn.execute("SELECT id FROM shardq_job ORDER BY id").fetchall()]
        pid = conn.info.backend_pid
        before_hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'shardq_job'"
        ).fetchone()
        began_cpu, began = cpu(pid), time.perf_counter()
        for start in range(0, len(ids), group):
            conn.execute(statement, [ids[start : start + group]], prepare=True)
        wall = time.perf_counter() - began
        spent = cpu(pid) - began_cpu
        # This backend's counts reach the shared statistics at its next
        # report, at most once a second (PG 15): force it, then read.
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        after_hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'shardq_job'"
        ).fetchone()
        size = conn.execute("SELECT pg_indexes_size('shardq_job')").fetchone()[0]
    updated = after_hot[0] - before_hot[0]
    return {
        "cpu_us_per_start": spent / len(ids) * 1e6,
        "wall_us_per_start": wall / len(ids) * 1e6,
        "hot_share": (after_hot[1] - before_hot[1]) / updated if updated else None,
        "index_bytes": size,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/hot_start.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--group", type=int, default=4)
    args = p.parse_args()
    from bench.ownserver import own_server

    with own_server("hotstart", "shardq_hotstart", migrate=True) as server:
        runs: dict[str, list[dict]] = {"today": [], "hot": []}
        for round_ in range(args.rounds):
            for name in ("today", "hot") if round_ % 2 == 0 else ("hot", "today"):
                out = one(server.url, TODAY if name == "today" else HOT, args.jobs, args.group)
                runs[name].append(out)
                print(
                    f"round {round_ + 1} {name:5s}: {out['cpu_us_per_start']:6.1f} µs CPU a start, "
                    f"{out['wall_us_per_start']:6.1f} µs wall, HOT {out['hot_share']:.0%}, "
                    f"indexes {out['index_bytes'] / 1e6:.1f} MB (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
        for figure in ("cpu_us_per_start", "wall_us_per_start"):
            ratios = [h[figure] / t[figure] for h, t in zip(runs["hot"], runs["today"], strict=True)]
            print(
                f"{figure}: today {statistics.median(r[figure] for r in runs['today']):.1f}, hot "
                f"{statistics.median(r[figure] for r in runs['hot']):.1f}, hot ÷ today {statistics.median(ratios):.2f}"
            )


if __name__ == "__main__":
    main()
