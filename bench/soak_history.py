"""``make soak-history``: history leaves the hot table under sustained load
(issue 27 §1; docs/benchmarks.md, "History").

    .venv/bin/python bench/soak_history.py [--minutes 60] [--load 0.7] [--database shardq_soak_history]

One ``shardq_worker --processes 1 --concurrency 4`` with the history kept
10 minutes (``HISTORY_DAYS`` = 10/1440) in partitions of 60 s, the archiver
moving jobs ``HISTORY_GRACE`` (60 s, the default) after they finished.

1. **Peak.** ``--peak-jobs`` (200,000: long enough that the archiver is at work) no-op jobs enqueued at once; the worker's drain
   rate (first to last finish) is the peak.
2. **Soak.** ``--minutes`` at ``--load`` × peak: this process enqueues a
   batch every 100 ms (open loop, paced to the schedule). Every
   ``--sample-seconds``: the sizes of ``shardq_job`` (heap) and its indexes,
   its live rows, the history's size and partitions, the backlog (READY
   jobs) and the jobs finished.

The server: by default (``--server own``) a PostgreSQL cluster of the bench's
own (tests/pgserver.py), as production runs one: autovacuum on, with the
per-table settings docs/operations.md gives for ``shardq_job`` (scale factor
0, threshold 10,000). ``--server shared`` uses DATABASE_URL's server instead;
where its autovacuum is off (this machine's), ``VACUUM shardq_job`` every
``--vacuum-seconds`` (default 30 there) stands in for it.

Writes ``bench/results/soak-history.json`` and ``docs/images/soak-history.png``
(hot table and index sizes over time); the verdict compares every sample
after minute 15 with their median (flat: within ±10 %).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def database_url(name: str) -> str:
    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/postgres")
    return base.rsplit("/", 1)[0] + "/" + name


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/soak_history.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--load", type=float, default=0.7)
    p.add_argument("--database", default="shardq_soak_history")
    p.add_argument("--peak-jobs", type=int, default=200_000)
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--retention-minutes", type=float, default=10.0)
    p.add_argument("--server", choices=["own", "shared"], default="own")
    p.add_argument(
        "--vacuum-seconds",
        type=float,
        default=None,
        help="VACUUM shardq_job this often (0: leave it to autovacuum; a server with autovacuum off, as this "
        "shared one, needs it: the hot table's updates leave dead rows whichever table history is in)",
    )
    args = p.parse_args()
    if args.vacuum_seconds is None:
        args.vacuum_seconds = 0.0 if args.server == "own" else 30.0
    server = None
    if args.server == "own":
        from tests.pgserver import PrivatePostgres

        server = PrivatePostgres(
            "soak",
            args.database,
            settings={
                "autovacuum": "on",
                "autovacuum_naptime": "10s",
                "shared_buffers": "256MB",
                "max_connections": "100",
                "synchronous_commit": "off",
            },
        )
        server.init()
        server.start()
        server.createdb()
        os.environ["DATABASE_URL"] = server.url
    try:
        run(args)
    finally:
        if server is not None:
            server.destroy()


def run(args) -> None:
    url = database_url(args.database)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.history_settings",
        "PYTHONPATH": str(REPO),
        "SHARDQ_BENCH_HISTORY_DAYS": str(args.retention_minutes / 1440),
        "SHARDQ_BENCH_HISTORY_PARTITION": "60",
    }
    os.environ.update(env)
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
        if autovacuum == "on":
            # docs/operations.md: the hot table's heap stays the size of its live rows.
            conn.execute(
                "ALTER TABLE shardq_job SET (autovacuum_vacuum_scale_factor = 0, "
                "autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0)"
            )
    print(
        f"server: {args.server} (autovacuum {autovacuum}); VACUUM by the bench every {args.vacuum_seconds:g} s",
        flush=True,
    )
    import django

    django.setup()
    from django.db import connection

    import shardq
    from tests.taskapp.tasks import noop

    def one(statement: str):
        with connection.cursor() as cursor:
            cursor.execute(statement)
            return cursor.fetchone()

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "shardq_worker", "--processes", "1", "--concurrency", "4"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: list[dict] = []
    try:
        # 1. Peak.
        for start in range(0, args.peak_jobs, 10_000):
            shardq.enqueue_many(noop, [((), {})] * min(10_000, args.peak_jobs - start))
        deadline = time.monotonic() + 600
        while one("SELECT count(*) FROM shardq_job WHERE status <> 'SUCCESSFUL'")[0] and time.monotonic() < deadline:
            time.sleep(0.5)
        (seconds,) = one(
            "SELECT extract(epoch FROM max(finished_at) - min(finished_at)) FROM "
            "(SELECT finished_at FROM shardq_job UNION ALL SELECT finished_at FROM shardq_job_history) AS f"
        )
        peak = args.peak_jobs / float(seconds)
        rate = peak * args.load
        print(f"peak {peak:.0f} jobs/s; soak at {rate:.0f} jobs/s for {args.minutes:g} min", flush=True)
        # 2. Soak.
        began = time.monotonic()
        sent = 0
        next_sample = began
        next_vacuum = began + args.vacuum_seconds if args.vacuum_seconds else float("inf")
        while (now := time.monotonic()) - began < args.minutes * 60:
            due = int((now - began) * rate) - sent
            if due > 0:
                shardq.enqueue_many(noop, [((), {})] * due)
                sent += due
            if now >= next_vacuum:
                with connection.cursor() as cursor:
                    cursor.execute("VACUUM shardq_job")
                next_vacuum = time.monotonic() + args.vacuum_seconds
            if now >= next_sample:
                row = one(
                    "SELECT pg_relation_size('shardq_job'), pg_indexes_size('shardq_job'), "
                    "(SELECT count(*) FROM shardq_job), (SELECT count(*) FROM shardq_job WHERE status = 'READY'), "
                    "(SELECT COALESCE(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits AS i "
                    " WHERE i.inhparent = 'shardq_job_history'::regclass), "
                    "(SELECT count(*) FROM pg_inherits AS i WHERE i.inhparent = 'shardq_job_history'::regclass), "
                    "(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'shardq_job')"
                )
                sample = dict(
                    zip(
                        ["heap", "indexes", "rows", "ready", "history_bytes", "partitions", "dead"],
                        [int(v) for v in row],
                        strict=True,
                    )
                )
                sample.update(minute=round((now - began) / 60, 3), sent=sent, load=os.getloadavg()[0])
                samples.append(sample)
                print(json.dumps(sample), flush=True)
                next_sample += args.sample_seconds
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(60)
    report(samples, peak, rate, args)


def report(samples: list[dict], peak: float, rate: float, args) -> None:
    late = [s for s in samples if s["minute"] >= 15]
    verdict = {}
    for key in ("heap", "indexes"):
        if late:
            median = statistics.median(s[key] for s in late)
            spread = max(abs(s[key] - median) / median for s in late) if median else 0.0
            verdict[key] = {"median_bytes": median, "max_deviation": round(spread, 3), "flat": spread <= 0.10}
    if late:
        verdict["ready_backlog_max"] = max(s["ready"] for s in late)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "peak_jobs_per_s": peak,
        "rate_jobs_per_s": rate,
        "minutes": args.minutes,
        "vacuum_seconds": args.vacuum_seconds,
        "server": args.server,
        "after_15": verdict,
    }
    (out / "soak-history.json").write_text(json.dumps({**result, "samples": samples}, indent=1))
    print(json.dumps(result, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    minutes = [s["minute"] for s in samples]
    ax.plot(minutes, [s["heap"] / 2**20 for s in samples], label="shardq_job heap (MiB)")
    ax.plot(minutes, [s["indexes"] / 2**20 for s in samples], label="shardq_job indexes (MiB)")
    ax.plot(minutes, [s["history_bytes"] / 2**20 for s in samples], label="shardq_job_history (MiB)", alpha=0.6)
    ax.axvline(15, color="grey", linestyle=":")
    ax.set_xlabel("minute")
    ax.set_ylabel("MiB")
    ax.set_title(f"{rate:.0f} jobs/s ({args.load:.0%} of peak), history kept {args.retention_minutes:g} min")
    ax.legend()
    fig.tight_layout()
    images = REPO / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    fig.savefig(images / "soak-history.png", dpi=100)


if __name__ == "__main__":
    main()
