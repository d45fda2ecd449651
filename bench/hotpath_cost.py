"""What PostgreSQL spends per no-op job on the hot path, with schema variants
side by side (issue 24; docs/benchmarks.md, "The database's share of a job").

    nice -n -10 .venv/bin/python bench/hotpath_cost.py [--jobs 20000] [--rounds 4] [--variants base,partial]

A PostgreSQL cluster of the bench's own (tests/pgserver.py, started by this
process, so it runs at this process's priority: start the bench under
``nice -n -10`` on a shared machine), autovacuum on with docs/operations.md's
settings for shardq_job, pg_stat_statements loaded. One database per variant,
each migrated by this checkout and then changed by the variant's SQL
(``VARIANTS``). Each round drains ``--jobs`` no-op jobs in each database
(which goes first rotates), one in-process worker of 4 threads in a fresh
process (bench/history_drain.py), the archiver moving every job to
shardq_job_history as it finishes (HISTORY_GRACE 0). Per job: the worker
process's CPU, its database sessions' CPU (/proc of the backends), the whole
server's CPU (every process of the cluster, autovacuum and WAL writer
included) and the drain rate. Prints each round, the medians, each variant's
ratio to the first one (median of per-round ratios) and, from the last
round, the statements that took the most server time per variant.

Writes bench/results/hotpath_cost.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import history  # noqa: E402

INFLIGHT = "NOT (status IN ('CLAIMED', 'RUNNING'))"
KWARGS = "DROP INDEX shardq_job_kwargs_idx; CREATE INDEX shardq_job_kwargs_idx ON shardq_job USING gin (kwargs jsonb_path_ops)"
TASK = "DROP INDEX shardq_job_task_idx; CREATE INDEX shardq_job_task_idx ON shardq_job (task_path, id DESC)"
VARIANTS: dict[str, list[str]] = {
    # As this checkout's migrations leave it.
    "base": [],
    # The search index by keyword argument over every version (before 0028).
    "full_kwargs": [KWARGS],
    # ... without the in-flight versions (the claim's and the start's): 0028.
    "partial_kwargs": [f"{KWARGS} WHERE {INFLIGHT}"],
    # The task index without them too.
    "partial_both": [f"{KWARGS} WHERE {INFLIGHT}", f"{TASK} WHERE {INFLIGHT}"],
    # No pending list: each entry goes straight into the GIN tree.
    "nofastupdate": ["ALTER INDEX shardq_job_kwargs_idx SET (fastupdate = off)"],
    # Every statement of every session on a generic plan (planned once per
    # prepared statement, not at each execution).
    "generic_all": [
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET plan_cache_mode = force_generic_plan', "
        "current_database()); END $$"
    ],
    # Every session planning each statement at each call, but the start and ack
    # connections (their own SET overrides the database's default).
    "custom_rest": [
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET plan_cache_mode = force_custom_plan', "
        "current_database()); END $$"
    ],
    # The floor: neither search index (what they cost at most).
    "nosearch": ["DROP INDEX shardq_job_kwargs_idx", "DROP INDEX shardq_job_task_idx"],
}
FIGURES = ("jobs_per_s", "worker_cpu_us", "db_hot_path_cpu_us", "db_cpu_us", "server_cpu_us")


def migrate(url: str, variant: str, checkout: Path = REPO) -> None:
    import psycopg

    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=checkout, env=env, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        # docs/operations.md: the hot table's heap stays the size of its live rows.
        conn.execute(
            "ALTER TABLE shardq_job SET (autovacuum_vacuum_scale_factor = 0, "
            "autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0)"
        )
        for statement in VARIANTS.get(variant, []):
            conn.execute(statement)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def top_statements(url: str, jobs: int, n: int = 8) -> list[dict]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, plans, total_exec_time, total_plan_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 80) "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY total_exec_time + total_plan_time DESC LIMIT %s",
            [n],
        ).fetchall()
    return [
        {"calls": c, "plans": n, "us_per_job": t * 1000 / jobs, "plan_us_per_job": pt * 1000 / jobs, "query": q}
        for c, n, t, pt, q in rows  # total_exec_time is in ms
    ]


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/hotpath_cost.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", default="full_kwargs,base", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. `git archive` of main): drained first in each round's order as 'baseline', "
        "its own code on its own migrations, no variant SQL",
    )
    args = p.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant {unknown[0]!r}: one of {', '.join(VARIANTS)}")
    import psycopg

    from bench.ownserver import own_server, postmaster_pid

    settings = {"autovacuum": "on", "autovacuum_naptime": "10s", "max_connections": "100"}
    with own_server("hotpath", settings=settings, statements=True) as server:
        postmaster = str(postmaster_pid(server))
        base = server.url.rsplit("/", 1)[0]
        urls = {}
        checkouts = {name: REPO for name in names}
        if args.baseline:
            names.insert(0, "baseline")
            checkouts["baseline"] = args.baseline.resolve()
        for name in names:
            server.createdb(f"hp_{name}")
            urls[name] = f"{base}/hp_{name}"
            migrate(urls[name], name, checkouts[name])
        runs: dict[str, list[dict]] = {name: [] for name in names}
        tops: dict[str, list[dict]] = {}
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                with psycopg.connect(urls[name], autocommit=True) as conn:
                    conn.execute("SELECT pg_stat_statements_reset()")
                result = history.drain(
                    urls[name], checkouts[name], args.jobs, {"SHARDQ_BENCH_POSTMASTER_PID": postmaster}
                )
                runs[name].append(result)
                tops[name] = top_statements(urls[name], args.jobs)
                print(
                    f"round {round_ + 1} {name:>20}: {result['jobs_per_s']:7,.0f} jobs/s  worker "
                    f"{result['worker_cpu_us']:6.1f}  db (worker's) {result['db_hot_path_cpu_us']:6.1f}  db (+archiver) "
                    f"{result['db_cpu_us']:6.1f}  server {result.get('server_cpu_us', 0):6.1f} µs/job  "
                    f"load {result['load']:.2f}",
                    flush=True,
                )
        summary: dict[str, dict] = {}
        first = names[0]
        for name in names:
            row = {k: statistics.median(r[k] for r in runs[name]) for k in FIGURES}
            if name != first:
                for k in FIGURES:
                    row[f"{k}_ratio"] = statistics.median(
                        a[k] / b[k] for a, b in zip(runs[name], runs[first], strict=True)
                    )
            summary[name] = row
        print(f"\nmedians of {args.rounds} rounds, {args.jobs:,} no-op jobs; ratio to {first}: median of rounds")
        for name, row in summary.items():
            print(
                f"  {name:>20}: "
                + "  ".join(
                    f"{k} {row[k]:,.1f}" + (f" ({row[k + '_ratio']:.3f}x)" if k + "_ratio" in row else "")
                    for k in FIGURES
                )
            )
        for name in names:
            print(f"\n  {name}: statements by server time, last round (execution and planning µs a job; calls, plans)")
            for t in tops[name]:
                print(
                    f"    {t['us_per_job']:7.1f} {t['plan_us_per_job']:7.1f} {t['calls']:7d} {t['plans']:6d}  {t['query']}"
                )
        out = REPO / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "hotpath_cost.json").write_text(
            json.dumps({"jobs": args.jobs, "summary": summary, "runs": runs, "statements": tops}, indent=1)
        )


if __name__ == "__main__":
    main()
