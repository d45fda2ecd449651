"""How fast a pause stops every worker (issue 27 §4: within 1 s; running
jobs finish, enqueue still works, nothing lost). Usage, with DATABASE_URL set
and migrated for tests.settings:

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=tests.settings \\
        .venv/bin/python bench/pause.py [--jobs 100000] [--workers 2] [--rounds 5]

Each round: the job table emptied, ``--jobs`` no-op ``stamp`` jobs enqueued
on the default queue, ``--workers`` real ``shardq_worker`` processes (4
threads each) started and left to drain at full speed; then
``shardq.queues.pause("default")`` commits and the database's clock is read
at once (T). A job whose thread began it reads RUNNING with ``started_at``,
and a thread begins only a job its worker claimed, so the last ``started_at``
after T bounds when the last worker stopped claiming (a job claimed before T
may still start just after it). One job is enqueued while paused (it must
stay READY), the round waits 2 s, then resumes and waits for everything to
finish: every job SUCCESSFUL with one attempt (lost: not run; doubled: run
twice). Prints each round and the medians.
"""

import argparse
import statistics
import time

import django

django.setup()


import shardq  # noqa: E402
from bench.bulk_retry import sql, start_workers, stop  # noqa: E402  (the same two-worker harness)
from shardq import queues  # noqa: E402
from tests.taskapp.tasks import stamp  # noqa: E402


def wait_for(query: str, done, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while True:
        value = sql(query)[0][0]
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {seconds:.0f} s (last value {value})")
        time.sleep(0.05)


def one_round(jobs: int, workers: int) -> dict:
    sql(
        "TRUNCATE shardq_job CASCADE; DELETE FROM shardq_worker; DELETE FROM shardq_queue_control; "
        "UPDATE shardq_shard SET owner = NULL, lease_expires = NULL"
    )
    for start in range(0, jobs, 10000):
        shardq.enqueue_many(stamp, [((), {})] * min(10000, jobs - start))
    sql("VACUUM ANALYZE shardq_job")
    procs = start_workers(workers)
    try:
        wait_for(
            "SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL AND pool = '*'",
            lambda n: n >= 64,
            120,
            "the workers taking every shard",
        )
        wait_for(
            "SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'",
            lambda n: n >= min(5000, jobs // 4),
            300,
            "the workers draining",
        )
        queues.pause("default", by="bench")
        paused_at = sql("SELECT clock_timestamp()")[0][0]
        late = shardq.enqueue_many(stamp, [((), {})])
        time.sleep(2.0)
        (after, last, left) = sql(
            "SELECT count(*) FILTER (WHERE started_at > %s), "
            "extract(epoch FROM max(started_at) FILTER (WHERE started_at > %s) - %s), "
            "count(*) FILTER (WHERE status = 'READY') FROM shardq_job",
            [paused_at, paused_at, paused_at],
        )[0]
        (late_status,) = sql("SELECT status FROM shardq_job WHERE id = %s", [int(late[0].id)])[0]
        running = sql("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING'")[0][0]
        queues.resume("default", by="bench")
        wait_for(
            "SELECT count(*) FROM shardq_job WHERE status <> 'SUCCESSFUL'",
            lambda n: n == 0,
            600,
            "every job finishing after the resume",
        )
    finally:
        stop(procs)
    (lost, doubled, total) = sql(
        "SELECT count(*) FILTER (WHERE status <> 'SUCCESSFUL'), count(*) FILTER (WHERE attempts > 1), count(*) "
        "FROM shardq_job"
    )[0]
    return {
        "started_after_pause": after,
        "last_start_after_pause_s": float(last or 0.0),
        "ready_while_paused": left,
        "running_2s_after_pause": running,
        "enqueued_while_paused": late_status,
        "lost": lost,
        "doubled": doubled,
        "total": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lasts, counts, bad = [], [], False
    for n in range(args.rounds):
        r = one_round(args.jobs, args.workers)
        lasts.append(r["last_start_after_pause_s"])
        counts.append(r["started_after_pause"])
        print(
            f"round {n + 1}: "
            + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
            flush=True,
        )
        bad |= bool(
            r["lost"]
            or r["doubled"]
            or r["total"] != args.jobs + 1
            or r["enqueued_while_paused"] != "READY"
            or r["running_2s_after_pause"]
        )
    print(
        f"last start after the pause: median {statistics.median(lasts) * 1000:.0f} ms, max {max(lasts) * 1000:.0f} ms "
        f"(target <= 1000 ms); jobs started after it: median {statistics.median(counts)}"
    )
    if bad:
        raise SystemExit("a round lost or doubled jobs, ran the job enqueued while paused, or still ran jobs 2 s after")


if __name__ == "__main__":
    main()
