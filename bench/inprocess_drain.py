"""No-op (or SLEEP-second) drain of one in-process worker, 4 threads: rate,
process CPU per job, and the worker's statement counters (start writes,
claims, acks). Usage, with DATABASE_URL set and migrated for tests.settings:

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=tests.settings [SLEEP=0.005] \\
        .venv/bin/python bench/inprocess_drain.py [jobs] [rounds]

Run it from two checkouts, alternated, to compare trees (docs/benchmarks.md,
"Issue 24").
"""

import os
import sys
import threading
import time

import django

django.setup()

from django.db import connection  # noqa: E402

import shardq  # noqa: E402
from shardq.worker.runtime import Worker, WorkerOptions  # noqa: E402
from tests.taskapp.limit_tasks import unlimited_sleep  # noqa: E402
from tests.taskapp.tasks import noop  # noqa: E402

SLEEP = float(os.environ.get("SLEEP", "0"))


def drain(n: int) -> tuple[float, float, dict]:
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE shardq_job; DELETE FROM shardq_worker; UPDATE shardq_shard SET owner = NULL, lease_expires = NULL"
        )
    for start in range(0, n, 10000):
        size = min(10000, n - start)
        if SLEEP:
            shardq.enqueue_many(unlimited_sleep, [((), {"sleep": SLEEP})] * size)
        else:
            shardq.enqueue_many(noop, [((), {})] * size)
    worker = Worker(WorkerOptions(concurrency=4))
    thread = threading.Thread(target=worker.run)
    thread.start()
    while not worker.leaser.held:
        time.sleep(0.01)
    cpu, began = time.process_time(), time.monotonic()
    while worker.stats["succeeded"] < n:
        time.sleep(0.01)
    wall, cpu = time.monotonic() - began, time.process_time() - cpu
    counters = worker.stats.snapshot()
    worker.request_stop()
    thread.join()
    return n / wall, cpu / n * 1e6, counters


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
        rate, cpu, c = drain(n)
        print(
            f"rate {rate:8.0f} jobs/s  cpu/job {cpu:6.1f} us  start writes {c['start_writes']}  "
            f"claims {c['claim_statements']}  acks {c['ack_writes']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
