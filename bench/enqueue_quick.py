"""Enqueue throughput: one job at a time (autocommit, one transaction) and bulk.

    DATABASE_URL=postgres://root@127.0.0.1:5432/shardq_bench .venv/bin/python bench/enqueue_quick.py

Uses the example project's settings (DATABASE_URL unset: the embedded server),
migrates the database, and deletes the jobs it wrote after every run. Prints a
table of jobs/s (median of --runs) and writes bench/results/enqueue_quick.json.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

import shardq  # noqa: E402
from example_project.demo.tasks import add, send_receipt  # noqa: E402


def one_by_one_autocommit(task, calls):
    return [task.enqueue(*args, **kwargs) for args, kwargs in calls]


def one_by_one_in_a_transaction(task, calls):
    with transaction.atomic():
        return [task.enqueue(*args, **kwargs) for args, kwargs in calls]


def bulk(task, calls):
    return shardq.enqueue_many(task, calls)


def calls_for(task, n):
    if task is send_receipt:  # keyed by customer_id: the key is hashed per job
        return [((), {"customer_id": i % 1000, "order_id": i}) for i in range(n)]
    return [((i, i), {}) for i in range(n)]


def delete(results):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM shardq_job WHERE id = ANY(%s)", [[int(r.id) for r in results]])


def measure(mode, task, n, runs):
    rates = []
    for _ in range(runs):
        calls = calls_for(task, n)
        started = time.perf_counter()
        results = mode(task, calls)
        elapsed = time.perf_counter() - started
        assert len(results) == n
        delete(results)
        rates.append(n / elapsed)
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per row; the table shows the median")
    parser.add_argument("--single", type=int, default=2000, help="jobs per one-by-one run")
    parser.add_argument("--bulk", type=int, default=10_000, help="jobs per enqueue_many call")
    options = parser.parse_args()
    if options.runs < 1 or options.single < 1 or options.bulk < 1:
        parser.error("--runs, --single and --bulk must be at least 1")

    call_command("migrate", verbosity=0)
    rows = []
    for label, mode, n in [
        ("task.enqueue, autocommit", one_by_one_autocommit, options.single),
        ("task.enqueue, one transaction.atomic", one_by_one_in_a_transaction, options.single),
        ("shardq.enqueue_many", bulk, options.bulk),
    ]:
        for task in (add, send_receipt):
            measure(mode, task, min(n, 200), 1)  # warm up: connection, caches
            rates = measure(mode, task, n, options.runs)
            rows.append(
                {
                    "mode": label,
                    "task": task.name + (" (keyed)" if task is send_receipt else ""),
                    "jobs": n,
                    "runs": options.runs,
                    "median_jobs_per_s": round(statistics.median(rates)),
                    "all_jobs_per_s": [round(r) for r in rates],
                }
            )

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    print(
        f"\nenqueue throughput — PostgreSQL {server}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, NOTIFY={'on' if add.get_backend().config.notify else 'off'}\n"
    )
    print(f"{'mode':<40} {'task':<22} {'jobs':>7} {'median jobs/s':>14}  runs")
    for row in rows:
        runs = ", ".join(str(r) for r in row["all_jobs_per_s"])
        print(f"{row['mode']:<40} {row['task']:<22} {row['jobs']:>7} {row['median_jobs_per_s']:>14}  {runs}")

    out = REPO / "bench" / "results" / "enqueue_quick.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"server_version": server, "cpu_count": os.cpu_count(), "rows": rows}
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
