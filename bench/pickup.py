"""Pickup latency at a steady enqueue rate (issue 24: p99 <= 5 ms at 200
jobs/s) on a PostgreSQL of the bench's own.

    nice -n -10 .venv/bin/python bench/pickup.py [--rate 200] [--seconds 10] [--rounds 3] [--notify 1]

``make bench``'s latency phase (bench/e2e.py ``Bench.shardq_latency``: one
``shardq_worker --processes 1 --concurrency 4``, bench/api_child.py
enqueuing ``noop`` one by one in autocommit at ``--rate``), run against a
cluster this process starts (tests/pgserver.py), so the server runs at this
process's priority: start it under ``nice -n -10`` on a shared machine. A
job's pickup is ``last_attempted_at - enqueued_at`` (both the database's
clock: the enqueue statement's start and the start write's). Prints p50,
p99 and max per round and their medians, with the 1-minute load; writes
bench/results/pickup.json.

pg_stat_statements is loaded: the statements that took the most server
time over all rounds are printed (calls, mean and max ms).
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/pickup.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--notify", type=int, choices=(0, 1), default=1)
    p.add_argument(
        "--settings",
        default=None,
        help="the worker's and the enqueuer's DJANGO_SETTINGS_MODULE (default: bench/e2e.py's, Django's default "
        "logging over tests.settings)",
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting (repeatable), e.g. synchronous_commit=off",
    )
    args = p.parse_args()
    from bench.ownserver import own_server

    settings = {"max_connections": "100"}
    for item in args.setting:
        name, _, value = item.partition("=")
        settings[name] = value
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    with own_server("pickup", "shardq_pickup", settings, statements=True, migrate=True) as server:
        import psycopg

        from bench import e2e

        bench = e2e.Bench(e2e.Options(server.url, rate=args.rate, latency_seconds=args.seconds))
        if args.settings:
            child_env, start_worker, settings_module = bench.child_env, bench.start_worker, args.settings
            bench.child_env = lambda settings=settings_module, **extra: child_env(settings, **extra)
            bench.start_worker = lambda *a, **k: start_worker(*a, **{**k, "settings": settings_module})
        rounds = []
        for round_ in range(args.rounds):
            out = bench.shardq_latency(bool(args.notify))
            out["load"] = os.getloadavg()[0]
            rounds.append(out)
            print(
                f"round {round_ + 1}: p50 {out['p50_ms']:.2f} ms  p99 {out['p99_ms']:.2f} ms  max {out['max_ms']:.2f} ms"
                f"  ({out['jobs']} jobs, load {out['load']:.2f})",
                flush=True,
            )
        with psycopg.connect(server.url, autocommit=True) as conn:
            top = conn.execute(
                "SELECT calls, mean_plan_time, mean_exec_time, max_exec_time, total_exec_time + total_plan_time,"
                " left(regexp_replace(query, '\\s+', ' ', 'g'), 80) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " ORDER BY total_exec_time + total_plan_time DESC LIMIT 10"
            ).fetchall()
        print("statements by server time (all rounds): calls, mean planning ms, mean execution ms, max, total ms")
        for calls, plan, mean, worst, total, query in top:
            print(f"  {calls:7d} {plan:7.3f} {mean:7.3f} {worst:8.2f} {total:9.1f}  {query}")
        summary = {k: statistics.median(r[k] for r in rounds) for k in ("p50_ms", "p99_ms", "max_ms", "load")}
        print(
            f"median of {args.rounds} rounds at {args.rate:g} jobs/s: p50 {summary['p50_ms']:.2f} ms, "
            f"p99 {summary['p99_ms']:.2f} ms, max {summary['max_ms']:.2f} ms (load {summary['load']:.2f})"
        )
        out_dir = REPO / "bench" / "results"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "pickup.json").write_text(
            json.dumps({"args": vars(args), "summary": summary, "rounds": rounds}, indent=1)
        )


if __name__ == "__main__":
    main()
