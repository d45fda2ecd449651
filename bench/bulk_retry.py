"""Retry 100,000 dead letters while workers drain (issue 27 §3: ≤ 10 s,
nothing lost or doubled). Usage, with DATABASE_URL set and migrated for
tests.settings:

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=tests.settings \\
        .venv/bin/python bench/bulk_retry.py [--dead 100000] [--busy 100000] [--workers 2] [--rounds 3]

Each round: the job table emptied, ``--dead`` dead-lettered no-op jobs
written (FAILED, attempts used up, spread over every shard) and ``--busy``
READY no-op jobs of another task enqueued; ``--workers`` real
``shardq_worker`` processes (4 threads each) started and left to drain the
busy jobs; then the clock runs over the bulk retry itself (shardq.bulk.run,
what ``manage.py shardq_jobs retry`` and the admin's "Retry all matching"
run; batches of ``--batch``), while the workers drain. Then it waits until
every retried job has run and checks each: SUCCESSFUL with exactly one
attempt (lost: not run; doubled: run twice). Prints each round and the
median of the retry's wall time.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import django

django.setup()

from django.db import connection  # noqa: E402

import shardq  # noqa: E402
from shardq import bulk  # noqa: E402
from shardq.models import Job  # noqa: E402
from tests.taskapp.tasks import noop, stamp  # noqa: E402

DEAD = """
INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
    key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
    args, kwargs, errors, worker_ids, enqueued_at, started_at, finished_at)
SELECT %s, 'default', 'default', 0, clock_timestamp(), g %% 64, g, NULL, false, 'FAILED', 2, 1, 1, 1,
       '[]'::jsonb, '{}'::jsonb,
       '[{"exception_class_path": "builtins.ValueError", "traceback": "ValueError: the partner API was down"}]'::jsonb,
       '[]'::jsonb, clock_timestamp(), clock_timestamp(), clock_timestamp()
FROM generate_series(1, %s) AS g
"""


def sql(statement, params=None):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else None


def start_workers(n: int) -> list[subprocess.Popen]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return [
        subprocess.Popen(
            [sys.executable, "manage.py", "shardq_worker", "--concurrency", "4"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def stop(workers: list[subprocess.Popen]) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.wait(60)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def one_round(dead: int, busy: int, workers: int, batch: int) -> dict:
    sql(
        "TRUNCATE shardq_job CASCADE; DELETE FROM shardq_worker; UPDATE shardq_shard SET owner = NULL, lease_expires = NULL"
    )
    sql(DEAD, [noop.module_path, dead])
    for start in range(0, busy, 10000):
        shardq.enqueue_many(stamp, [((), {})] * min(10000, busy - start))
    sql("VACUUM ANALYZE shardq_job")
    procs = start_workers(workers)
    try:
        deadline = time.monotonic() + 120
        while sql("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL AND pool = '*'")[0][0] < 64:
            if time.monotonic() > deadline:
                raise SystemExit("the workers did not take the shards within 120 s")
            time.sleep(0.1)
        while busy and sql("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] < min(2000, busy):
            time.sleep(0.05)  # the workers are draining
        draining = sql(
            "SELECT count(*) FROM shardq_job WHERE status <> 'SUCCESSFUL' AND task_path = %s", [stamp.module_path]
        )[0][0]
        began = time.monotonic()
        result = bulk.run(bulk.ACTIONS["retry"], Job.objects.filter(task_path=noop.module_path), batch=batch)
        wall = time.monotonic() - began
        busy_left = sql(
            "SELECT count(*) FROM shardq_job WHERE status <> 'SUCCESSFUL' AND task_path = %s", [stamp.module_path]
        )[0][0]
        deadline = time.monotonic() + 600
        while sql(
            "SELECT count(*) FROM shardq_job WHERE task_path = %s AND status <> 'SUCCESSFUL'", [noop.module_path]
        )[0][0]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        ran_all = time.monotonic() - began
    finally:
        stop(procs)
    (lost, doubled, ok) = sql(
        "SELECT count(*) FILTER (WHERE status <> 'SUCCESSFUL'), count(*) FILTER (WHERE attempts > 1), "
        "count(*) FILTER (WHERE status = 'SUCCESSFUL' AND attempts = 1) FROM shardq_job WHERE task_path = %s",
        [noop.module_path],
    )[0]
    return {
        "retry_seconds": wall,
        "retried": result.done,
        "skipped": result.skipped,
        "busy_jobs_left_when_it_began": draining,
        "busy_jobs_left_when_it_ended": busy_left,
        "all_retried_ran_seconds": ran_all,
        "lost": lost,
        "doubled": doubled,
        "ran_once": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--busy", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=bulk.DEFAULT_BATCH)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    walls = []
    bad = False
    for n in range(args.rounds):
        r = one_round(args.dead, args.busy, args.workers, args.batch)
        walls.append(r["retry_seconds"])
        print(
            f"round {n + 1}: "
            + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
            flush=True,
        )
        bad |= bool(r["lost"] or r["doubled"] or r["retried"] != args.dead)
    print(f"median retry of {args.dead} dead letters: {statistics.median(walls):.2f} s (target <= 10 s)")
    if bad:
        raise SystemExit("a round lost, doubled or missed jobs")


if __name__ == "__main__":
    main()
