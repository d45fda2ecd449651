"""What the admin's search indexes cost the hot path: enqueue rate and a
no-op drain, with the indexes and without them, alternated round by round
in one run. By default the three every job is in: ``shardq_job_kwargs_idx``
(GIN jsonb_path_ops on kwargs), ``shardq_job_task_idx`` and
``shardq_job_key_idx`` (``--indexes`` names others; the tag and dead-letter
indexes hold only tagged jobs and dead letters, which these jobs are not).

    DATABASE_URL=... .venv/bin/python bench/search_index_cost.py [--rounds 8] [--jobs 20000] [--enqueue 3000]

Each round, for each side (which goes first alternates): the indexes are
created (on) or dropped (off) on the emptied table, then ``--enqueue`` jobs
of ``tests.taskapp.tasks.keyed(user_id=..., note=...)`` are enqueued one by
one in autocommit through the public API (this process), then ``--jobs``
READY jobs of the same task with the same kind of keyword arguments are
drained by one ``shardq_worker --processes 1 --concurrency 4``
(bench/e2e.py's ``shardq_drain``: wall, steady rate, worker CPU a job).
Prints each round and the medians of on ÷ off per round. The index is left
as the migration makes it (on) at the end. Runs in its own database
(``--database``, default shardq_search_bench).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INDEXES = ("shardq_job_kwargs_idx", "shardq_job_task_idx", "shardq_job_key_idx")
KEYED = "tests.taskapp.tasks.keyed"


def fill_keyed(url: str, n: int) -> None:
    """``n`` READY jobs of ``keyed`` with two keyword arguments each (setup, not measured)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT %(task)s, 'default', 'default', 0, t, h & 63, h, NULL, false, 'READY', 0, 0, 0, 1,
                   '[]'::jsonb, jsonb_build_object('user_id', g %% 50000, 'note', 'invoice ' || g),
                   '[]'::jsonb, '[]'::jsonb, t
            FROM (SELECT g, (random() * 4294967295 - 2147483648)::bigint::int AS h, clock_timestamp() AS t
                  FROM generate_series(1, %(n)s) AS g) AS g
            """,
            {"task": KEYED, "n": n},
        )
        conn.execute("ANALYZE shardq_job")


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/search_index_cost.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs a drain")
    p.add_argument("--enqueue", type=int, default=3000, help="jobs enqueued one by one a round")
    p.add_argument("--database", default="shardq_search_bench")
    p.add_argument("--indexes", default=",".join(INDEXES), help="the indexes toggled (comma-separated)")
    args = p.parse_args()
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connections

    from bench import e2e
    from tests.taskapp.tasks import keyed

    url = e2e.bench_database(args.database)
    # This process enqueues into the bench database too.
    connections["default"].close()
    connections["default"].settings_dict["NAME"] = args.database
    e2e.limit.fill = lambda url, n: fill_keyed(url, n)  # the drain's jobs: keyed, with kwargs
    bench = e2e.Bench(e2e.Options(database_url=url, jobs=args.jobs))
    names = [n.strip() for n in args.indexes.split(",") if n.strip()]
    found = dict(bench.sql("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [names]))
    missing = sorted(set(names) - set(found))
    if missing:
        sys.exit(f"no index {', '.join(missing)} in {args.database}: migrate it, or name others with --indexes")
    create = [d.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1) for d in found.values()]

    def toggle(on: bool) -> None:
        for index, definition in zip(found, create, strict=True):
            bench.sql(definition if on else f"DROP INDEX IF EXISTS {index}")

    runs: dict[str, list[dict]] = {"on": [], "off": []}
    load = []
    try:
        for round_ in range(args.rounds):
            order = ["on", "off"] if round_ % 2 == 0 else ["off", "on"]
            for side in order:
                bench.reset()
                toggle(side == "on")
                started = time.perf_counter()
                for i in range(args.enqueue):
                    keyed.enqueue(user_id=i % 50_000, note=f"invoice {i}")
                enqueue_rate = args.enqueue / (time.perf_counter() - started)
                result = bench.shardq_drain(1, args.jobs, name=f"search-{side}")
                result["enqueue_rate"] = enqueue_rate
                runs[side].append(result)
                load.append(os.getloadavg()[0])
                print(
                    f"round {round_ + 1} indexes {side:3}  enqueue {enqueue_rate:7,.0f} jobs/s"
                    f"  drain wall {result['wall_rate']:7,.0f} jobs/s"
                    f"  steady {result['steady_rate'] or 0:7,.0f} jobs/s"
                    f"  cpu {result.get('cpu_us_per_job') or 0:6.1f} µs/job  load {load[-1]:.2f}",
                    flush=True,
                )
    finally:
        bench.reset()
        toggle(True)
        bench.conn.close()
    for what in ("enqueue_rate", "wall_rate", "steady_rate", "cpu_us_per_job"):
        ratios = [a[what] / b[what] for a, b in zip(runs["on"], runs["off"], strict=True) if a[what] and b[what]]
        print(
            f"{what}: on ÷ off median of rounds {statistics.median(ratios):.3f}"
            f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); medians: off"
            f" {statistics.median(r[what] for r in runs['off']):,.1f}, on"
            f" {statistics.median(r[what] for r in runs['on']):,.1f}"
        )
    print(f"load average (1 min) during the run: median {statistics.median(load):.2f}, max {max(load):.2f}")


if __name__ == "__main__":
    main()
