"""What dead-owner detection costs at idle (docs/reliability.md, "A worker that dies").

    .venv/bin/python bench/dead_owner_idle.py [--workers 3] [--seconds 30] [--rounds 2]

``--workers`` idle ``shardq_worker`` processes (default settings: HEARTBEAT
10 s, DEAD_OWNER_CHECK 0.1 s) with detection on, then off, alternated
``--rounds`` times. After a settle of 5 s, for ``--seconds``: the CPU time
of the worker processes and of their database sessions (PostgreSQL's
backends on this machine, read from /proc through psutil), per worker and
per second of wall time, and the dead-owner checks a second (the workers'
``dead_owner_checks`` counters, from their rows at a heartbeat).

Prints one JSON document and a line per mode.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run(bench, workers: int, seconds: float, detection: bool) -> dict:
    from bench.fairness import worker_pids

    bench.reset()
    env = {"SHARDQ_DEAD_OWNER_DETECTION": "true" if detection else "false"}
    procs = [bench.start_worker(1, env=env, name=f"idle-{i}", concurrency=4) for i in range(workers)]
    try:
        deadline = time.monotonic() + 120
        while (
            len(worker_pids(bench, procs)) < workers
            or bench.sql("SELECT count(*) FROM shardq_shard WHERE pool = '*' AND owner IS NOT NULL")[0][0] < 64
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start")
            time.sleep(0.2)
        time.sleep(5.0)  # settle: imports done, shares held
        children = list(worker_pids(bench, procs).values())
        backends = [
            pid
            for (pid,) in bench.sql(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'shardq-%%'"
            )
        ]
        leasers = [
            pid
            for (pid,) in bench.sql(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'shardq-leaser'"
            )
        ]
        checks_before = checks(bench)
        began = time.monotonic()
        workers_cpu, backends_cpu, leasers_cpu = cpu_seconds(children), cpu_seconds(backends), cpu_seconds(leasers)
        time.sleep(seconds)
        wall = time.monotonic() - began
        workers_cpu = cpu_seconds(children) - workers_cpu
        backends_cpu = cpu_seconds(backends) - backends_cpu
        leasers_cpu = cpu_seconds(leasers) - leasers_cpu
        time.sleep(10.5)  # a heartbeat: the counters in the rows
        checks_after = checks(bench)
        checks_wall = wall + 10.5
    finally:
        for proc in procs:
            bench.stop_worker(proc)
    return {
        "detection": detection,
        "workers": workers,
        "seconds": wall,
        "worker_cpu_ms_per_s_each": 1000 * workers_cpu / wall / workers,
        "backend_cpu_ms_per_s_each": 1000 * backends_cpu / wall / workers,
        "leaser_backend_cpu_ms_per_s_each": 1000 * leasers_cpu / wall / max(1, len(leasers)),
        "checks_per_s_each": (checks_after - checks_before) / checks_wall / workers,
    }


def checks(bench) -> int:
    return sum(
        int(n or 0)
        for (n,) in bench.sql("SELECT (stats->>'dead_owner_checks')::bigint FROM shardq_worker WHERE state = 'RUNNING'")
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/dead_owner_idle.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--database", default="shardq_bench")
    args = p.parse_args()
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    url = e2e.bench_database(args.database)
    options = e2e.Options(database_url=url, phases=("dead_owner_idle",), write_docs=False, rounds=args.rounds)
    bench = e2e.Bench(options)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    try:
        for _ in range(args.rounds):
            for mode in ("on", "off"):
                runs[mode].append(run(bench, args.workers, args.seconds, mode == "on"))
    finally:
        bench.reset()
        bench.conn.close()
    print(json.dumps(runs, indent=2))
    for mode, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0] if k.endswith("_each")}
        print(
            f"detection {mode}: per idle worker, worker process {med['worker_cpu_ms_per_s_each']:.2f} ms CPU/s, "
            f"its database sessions {med['backend_cpu_ms_per_s_each']:.2f} ms CPU/s (the lease session "
            f"{med['leaser_backend_cpu_ms_per_s_each']:.2f}), {med['checks_per_s_each']:.1f} checks/s "
            f"(median of {len(results)} rounds of {args.seconds:g} s, {args.workers} workers)"
        )


if __name__ == "__main__":
    main()
