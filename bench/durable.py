"""A no-op drain beside 100,000 suspended durable jobs against one beside
none (issue 26: ≥ 0.95×). Usage, with DATABASE_URL set and migrated for
tests.settings:

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=tests.settings \\
        .venv/bin/python bench/durable.py [--jobs 20000] [--suspended 100000] [--rounds 6]

Each round drains ``--jobs`` READY no-op jobs with one in-process worker (4
threads, its waker running), once with the table holding ``--suspended``
SUSPENDED jobs spread over every shard (half waiting for a signal with no
timeout, half asleep until some time in the next hour, as real ones are)
and once with none; which goes first alternates. The suspended rows are
written, the table VACUUM ANALYZEd and a CHECKPOINT taken (both arms),
before the clock starts. Prints each round
and the median of the per-round ratios (with ÷ without) of the rate.
"""

import argparse
import logging
import statistics
import threading
import time

import django

django.setup()

from django.db import connection  # noqa: E402

import shardq  # noqa: E402
from shardq.worker.runtime import Worker, WorkerOptions  # noqa: E402
from tests.taskapp.tasks import noop  # noqa: E402

SUSPEND = """
INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
    key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
    args, kwargs, errors, worker_ids, enqueued_at, started_at)
SELECT 'tests.taskapp.durable_tasks.approver', 'default', 'default', 0,
       CASE WHEN g %% 2 = 0 THEN timestamptz '9999-12-01' ELSE clock_timestamp() + make_interval(secs => 600 + g %% 3000) END,
       g %% 64, g, NULL, false, 'SUSPENDED', 3, 1, 0, 3,
       '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp(), clock_timestamp()
FROM generate_series(1, %s) AS g
"""


def drain(jobs: int, suspended: int) -> float:
    """Jobs per second of one drain of ``jobs`` no-ops beside ``suspended``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE shardq_job CASCADE; DELETE FROM shardq_worker; "
            "UPDATE shardq_shard SET owner = NULL, lease_expires = NULL"
        )
        if suspended:
            cursor.execute(SUSPEND, [suspended])
    for start in range(0, jobs, 10000):
        shardq.enqueue_many(noop, [((), {})] * min(10000, jobs - start))
    with connection.cursor() as cursor:
        # Both arms start vacuumed and checkpointed: else the insert's
        # autovacuum, or the checkpoint writing its pages, lands in one drain.
        cursor.execute("VACUUM ANALYZE shardq_job")
        cursor.execute("CHECKPOINT")
    logging.getLogger("shardq").setLevel(logging.WARNING)
    worker = Worker(WorkerOptions(concurrency=4))
    thread = threading.Thread(target=worker.run)
    thread.start()
    while not worker.leaser.held:
        time.sleep(0.01)
    began = time.monotonic()
    while worker.stats["succeeded"] < jobs:
        time.sleep(0.01)
    wall = time.monotonic() - began
    worker.request_stop()
    thread.join()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shardq_job WHERE status = 'SUSPENDED'")
        left = cursor.fetchone()[0]
    if left != suspended:
        raise SystemExit(f"the drain woke suspended jobs: {left} of {suspended} left")
    return jobs / wall


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/durable.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--suspended", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    ratios, beside, alone = [], [], []
    for round_ in range(args.rounds):
        order = [args.suspended, 0] if round_ % 2 == 0 else [0, args.suspended]
        rates = {n: drain(args.jobs, n) for n in order}
        beside.append(rates[args.suspended])
        alone.append(rates[0])
        ratios.append(rates[args.suspended] / rates[0])
        print(
            f"round {round_ + 1}: beside {args.suspended} suspended {rates[args.suspended]:7.0f} jobs/s, "
            f"beside none {rates[0]:7.0f} jobs/s, ratio {ratios[-1]:.3f}",
            flush=True,
        )
    print(
        f"medians: beside {args.suspended} suspended {statistics.median(beside):.0f} jobs/s, beside none "
        f"{statistics.median(alone):.0f} jobs/s; median ratio {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
