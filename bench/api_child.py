"""The shardq side of the enqueue and latency benchmarks, run as a child process.

``bench/e2e.py`` starts it with ``DJANGO_SETTINGS_MODULE=tests.settings`` (the
settings that know ``tests.taskapp.tasks.noop``) and the bench database's
``DATABASE_URL``; it prints one JSON line on stdout.

    enqueue MODE N REPEAT   MODE: atomic | autocommit | bulk; seconds per run
    pairs MODE N CHUNKS     MODE: atomic | autocommit; N jobs in CHUNKS chunks, each
                            chunk run by the bare psycopg loop (bench/limit.py)
                            and then by noop.enqueue(): seconds per chunk, side by side
    steady RATE SECONDS     noop.enqueue() at RATE jobs/s, autocommit
    urgent N INTERVAL BACKLOG
                            N times, every INTERVAL seconds: top the READY priority-0
                            noop jobs up to BACKLOG, then stamp.using(priority=100).enqueue()
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
from tests.taskapp.tasks import noop, stamp  # noqa: E402

TOP_UP = """
    INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
        key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
        args, kwargs, errors, worker_ids, enqueued_at)
    SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 0, t, h & 63, h, NULL, false, 'READY', 0, 0, 0, 1,
           '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, t
    FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, clock_timestamp() AS t
          FROM generate_series(1, GREATEST(0, %s - (SELECT count(*) FROM shardq_job WHERE status = 'READY')))) AS g
"""


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
    elif argv[:1] == ["urgent"]:
        count, interval, backlog = int(argv[1]), float(argv[2]), int(argv[3])
        urgent = stamp.using(priority=100)
        ids = []
        started = time.perf_counter()
        for i in range(count):
            delay = started + i * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            # The worker drains the backlog meanwhile: each urgent job finds
            # BACKLOG priority-0 jobs READY ahead of it (and a full buffer).
            with connection.cursor() as cursor:
                cursor.execute(TOP_UP, [backlog])
            ids.append(int(urgent.enqueue().id))
        print(json.dumps({"ids": ids}))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
