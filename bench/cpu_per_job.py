"""CPU per no-op job of one in-process worker beside bench/limit.py's bare
loops (issue 24's CPU target), alternated rounds, medians.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=tests.settings \\
        .venv/bin/python bench/cpu_per_job.py [jobs] [rounds]

On DATABASE_URL's database (migrated for tests.settings; its jobs are
deleted). Each round drains ``jobs`` READY no-op jobs three ways:

- ``ahead``: ``limit.Drainer(start_ahead=True)``, the loop before issue 24
  (the claim writes every start; one claim and one ack per 256 jobs);
- ``honest``: ``limit.Drainer()``, a start written per job as it begins;
- ``worker``: ``bench/inprocess_drain.py``'s drain, a ``Worker`` with four
  threads in this process.

CPU is this process's (``time.process_time()`` over the drain only;
PostgreSQL's is not counted), so a loaded machine inflates every figure
alike: compare the ratios, the median of per-round ratios printed last.
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django

django.setup()

from django.db import connection  # noqa: E402

from bench import limit  # noqa: E402
from bench.inprocess_drain import drain as worker_drain  # noqa: E402


def bare(n: int, start_ahead: bool) -> tuple[float, float]:
    """(jobs/s, µs of CPU a job) of one bare loop draining ``n`` jobs."""
    url = os.environ["DATABASE_URL"]
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE shardq_job; DELETE FROM shardq_worker")
    limit.fill(url, n)
    worker = limit.new_worker_id()
    limit.own_shards(url, worker, list(range(limit.SHARD_COUNT)))
    drainer = limit.Drainer(url, worker, list(range(limit.SHARD_COUNT)), start_ahead=start_ahead)
    drainer.warm()
    cpu, began = time.process_time(), time.monotonic()
    done = drainer.drain_available()
    cpu, wall = time.process_time() - cpu, time.monotonic() - began
    drainer.conn.close()
    assert done == n, f"drained {done} of {n}"
    return n / wall, cpu / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    runs: dict[str, list[tuple[float, float]]] = {"ahead": [], "honest": [], "worker": []}
    for r in range(rounds):
        for name, figures in runs.items():
            if name == "worker":
                rate, cpu, _ = worker_drain(n)
            else:
                rate, cpu = bare(n, start_ahead=name == "ahead")
            figures.append((rate, cpu))
            print(f"round {r + 1} {name:6s} {rate:7.0f} jobs/s  {cpu:6.1f} us CPU a job", flush=True)
    for name, figures in runs.items():
        rate = statistics.median(f[0] for f in figures)
        cpu = statistics.median(f[1] for f in figures)
        print(f"median {name:6s} {rate:7.0f} jobs/s  {cpu:6.1f} us CPU a job")
    worker = [f[1] for f in runs["worker"]]
    for loop in ("ahead", "honest"):
        ratio = statistics.median(w / f[1] for w, f in zip(worker, runs[loop], strict=True))
        print(f"worker CPU a job / {loop} loop's: {ratio:.2f} (median of per-round ratios)")


if __name__ == "__main__":
    main()
