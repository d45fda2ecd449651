"""One round of bench/history.py: a no-op drain of one in-process worker
(4 threads), run in a fresh process of a checkout (PYTHONPATH, cwd) on
DATABASE_URL. Prints one JSON line: jobs/s, the worker process's CPU per job
and the database backends' CPU per job (the worker's connections, read from
/proc: the server runs on this machine), from the first claim until every
job finished and, with history on, was moved to shardq_job_history.

    DATABASE_URL=... DJANGO_SETTINGS_MODULE=tests.settings PYTHONPATH=CHECKOUT \\
        python bench/history_drain.py JOBS
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import django

django.setup()

# This script's own directory (first on sys.path), not the package of the
# checkout under test (PYTHONPATH), which may predate bench/cpu.py.
from cpu import cluster_cpu  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

import shardq  # noqa: E402
from shardq.worker.runtime import Worker, WorkerOptions  # noqa: E402
from tests.taskapp.tasks import noop  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def rows(statement: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def backend_cpu() -> dict[int, tuple[str, float]]:
    """(application name, CPU seconds so far) of each backend of this database
    serving a shardq worker connection."""
    found = {}
    for pid, name in rows(
        "SELECT pid, application_name FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE 'shardq-%%'"
    ):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return found


def server_cpu() -> float | None:
    """CPU seconds of the whole server so far (bench/cpu.py ``cluster_cpu``),
    when SHARDQ_BENCH_POSTMASTER_PID names its postmaster (a server of the
    bench's own)."""
    pid = os.environ.get("SHARDQ_BENCH_POSTMASTER_PID")
    return cluster_cpu(pid) if pid else None


def main() -> None:
    n = int(sys.argv[1])
    history = bool(rows("SELECT to_regclass('shardq_job_history') IS NOT NULL")[0][0])
    if history:
        settings.SHARDQ = {**settings.SHARDQ, "HISTORY_GRACE": 0.0}
        # This round's rows from the last round: the partitions of today on.
        for (name,) in rows(
            "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'shardq_job_history'::regclass AND (regexp_match(pg_get_expr(c.relpartbound, c.oid),"
            " 'TO \\(''([^'']+)''\\)'))[1]::timestamptz > date_trunc('day', clock_timestamp())"
        ):
            rows(f'TRUNCATE "{name}"')
    rows("TRUNCATE shardq_job; DELETE FROM shardq_worker; UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")
    rows("VACUUM ANALYZE shardq_job")
    for start in range(0, n, 10_000):
        shardq.enqueue_many(noop, [((), {})] * min(10_000, n - start))
    worker = Worker(WorkerOptions(concurrency=4))
    thread = threading.Thread(target=worker.run)
    thread.start()
    while not worker.leaser.held:
        time.sleep(0.01)
    db_before = backend_cpu()
    server_before = server_cpu()
    cpu, began = time.process_time(), time.monotonic()
    while worker.stats["succeeded"] < n:
        time.sleep(0.01)
    wall = time.monotonic() - began
    worker_cpu = time.process_time() - cpu
    if history:
        deadline = time.monotonic() + 300
        while rows("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] and time.monotonic() < deadline:
            time.sleep(0.05)
    db_after = backend_cpu()
    server_after = server_cpu()
    spent = {pid: (name, after - db_before.get(pid, (name, 0.0))[1]) for pid, (name, after) in db_after.items()}
    db = sum(seconds for _, seconds in spent.values())
    # The archiver's connection works off the job's path (one per cluster, in batches).
    archiver = sum(seconds for name, seconds in spent.values() if name == "shardq-archiver")
    worker.request_stop()
    thread.join()
    moved = worker.stats.snapshot().get("archived", 0)
    print(
        json.dumps(
            {
                "jobs_per_s": n / wall,
                "worker_cpu_us": worker_cpu / n * 1e6,
                "db_cpu_us": db / n * 1e6,
                "db_hot_path_cpu_us": (db - archiver) / n * 1e6,
                "db_archiver_cpu_us": archiver / n * 1e6,
                "hot_path_cpu_us": (worker_cpu + db - archiver) / n * 1e6,
                "total_cpu_us": (worker_cpu + db) / n * 1e6,
                "archived": moved,
                "load": os.getloadavg()[0],
                **(
                    {"server_cpu_us": (server_after - server_before) / n * 1e6}
                    if server_before is not None and server_after is not None
                    else {}
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
