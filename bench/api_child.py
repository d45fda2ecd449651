"""The shardq side of the enqueue and latency benchmarks, run as a child process.

``bench/e2e.py`` starts it with ``DJANGO_SETTINGS_MODULE=tests.settings`` (the
settings that know ``tests.taskapp.tasks.noop``) and the bench database's
``DATABASE_URL``; it prints one JSON line on stdout.

    enqueue MODE N REPEAT   MODE: atomic | autocommit | bulk; seconds per run
    pairs MODE N CHUNKS     MODE: atomic | autocommit; N jobs in CHUNKS chunks, each
                            chunk run by the bare psycopg loop (bench/limit.py)
                            and then by noop.enqueue(): seconds per chunk, side by side
    steady RATE SECONDS     noop.enqueue() at RATE jobs/s, autocommit
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.db import connection, transaction  # noqa: E402

import shardq  # noqa: E402
from tests.taskapp.tasks import noop  # noqa: E402


def run_enqueue(mode: str, n: int) -> float:
    started = time.perf_counter()
    if mode == "atomic":
        with transaction.atomic():
            results = [noop.enqueue() for _ in range(n)]
    elif mode == "autocommit":
        results = [noop.enqueue() for _ in range(n)]
    elif mode == "bulk":
        results = shardq.enqueue_many(noop, [((), {})] * n)
    else:
        raise SystemExit(f"unknown enqueue mode {mode!r}")
    elapsed = time.perf_counter() - started
    assert len(results) == n
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM shardq_job WHERE id = ANY(%s)", [[int(r.id) for r in results]])
    return elapsed


def run_pairs(mode: str, n: int, chunks: int) -> dict:
    """The limit's and shardq's one-by-one enqueue, alternated chunk by chunk
    seconds apart: an fsync-bound figure on a shared server drifts less
    between two neighbouring chunks than between two runs."""
    from bench import limit

    size = max(1, n // chunks)
    url = os.environ["DATABASE_URL"]
    out: dict[str, list[float]] = {"limit": [], "shardq": [], "jobs_per_chunk": size}
    for _ in range(chunks):
        out["limit"].append(limit.insert_enqueue(url, size, transaction=mode == "atomic"))
        out["shardq"].append(run_enqueue(mode, size))
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE shardq_job")
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["enqueue"]:
        mode, n, repeat = argv[1], int(argv[2]), int(argv[3])
        run_enqueue(mode, min(n, 200))  # warm up: connection, caches, first plans
        print(json.dumps({"seconds": [run_enqueue(mode, n) for _ in range(repeat)]}))
    elif argv[:1] == ["pairs"]:
        mode, n, chunks = argv[1], int(argv[2]), int(argv[3])
        run_enqueue(mode, min(n, 200))  # warm up: connection, caches, first plans
        print(json.dumps(run_pairs(mode, n, chunks)))
    elif argv[:1] == ["steady"]:
        rate, seconds = float(argv[1]), float(argv[2])
        count = int(rate * seconds)
        noop.enqueue()  # warm up: connection
        started = time.perf_counter()
        for i in range(count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            noop.enqueue()
        print(json.dumps({"enqueued": count + 1, "seconds": time.perf_counter() - started}))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
