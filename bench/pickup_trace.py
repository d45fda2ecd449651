"""Where a job's pickup time goes at a steady enqueue rate: one in-process
worker (4 threads) on a PostgreSQL of the bench's own, this process's
threads timed at each step of the pickup path.

    nice -n -10 .venv/bin/python bench/pickup_trace.py [--rate 200] [--seconds 10]

An enqueuer process (bench/api_child.py ``steady``: ``noop.enqueue()`` one
by one in autocommit) sends jobs at ``--rate``; the worker here takes them.
For each job, from the enqueue statement's start (``enqueued_at``, the
server's clock, the same machine's):

- **claim_begin** / **claim_end**: the claim_jobs statement that took it;
- **start_begin**: its thread asked for the start write (Starter._write);
- **started**: ``last_attempted_at`` (the start write's clock_timestamp(), the
  pickup's end as bench/e2e.py measures it);
- **start_end**: the start write returned.

Prints p50/p90/p99 of each step's offset and of each gap, the claims and
their durations, the empty claims (claim_jobs that took nothing) between
two jobs. Monkeypatches methods of this process's own worker: a bench tool,
never the library's behaviour.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def q(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/pickup_trace.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    from bench.ownserver import own_server

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    with own_server("trace", "shardq_trace", migrate=True) as server:
        run(server.url, args)


def run(url: str, args) -> None:
    import django

    django.setup()
    from shardq.db.store import WorkerStore
    from shardq.worker import starter
    from shardq.worker.runtime import Worker, WorkerOptions

    claims: list[tuple[float, float, list[int]]] = []
    starts: dict[int, tuple[float, float]] = {}
    claim_jobs, write = WorkerStore.claim_jobs, starter.StartWrites._write

    def traced_claim(self, *a, **k):
        began = time.time()
        rows = claim_jobs(self, *a, **k)
        claims.append((began, time.time(), [r.id for r in rows]))
        return rows

    def traced_write(self, jobs):
        began = time.time()
        try:
            return write(self, jobs)
        finally:
            ended = time.time()
            for job in jobs:
                starts[job.id] = (began, ended)

    WorkerStore.claim_jobs = traced_claim
    starter.StartWrites._write = traced_write

    worker = Worker(WorkerOptions(concurrency=4))
    thread = threading.Thread(target=worker.run)
    thread.start()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while (
            conn.execute(
                "SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL AND lease_expires > clock_timestamp()"
            ).fetchone()[0]
            < 64
        ):
            time.sleep(0.05)
        time.sleep(0.5)
        claims.clear()
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(REPO)}
        subprocess.run(
            [sys.executable, str(REPO / "bench" / "api_child.py"), "steady", str(args.rate), str(args.seconds)],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + 30
        while conn.execute("SELECT count(*) FROM shardq_job WHERE status <> 'SUCCESSFUL'").fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError("jobs left unfinished")
            time.sleep(0.05)
        jobs = conn.execute(
            "SELECT id, extract(epoch FROM enqueued_at)::float8, extract(epoch FROM last_attempted_at)::float8"
            " FROM shardq_job ORDER BY id"
        ).fetchall()
    worker.request_stop()
    thread.join()
    claimed_by = {job_id: (b, e) for b, e, ids in claims for job_id in ids}
    steps: dict[str, list[float]] = {k: [] for k in ("claim_begin", "claim_end", "start_begin", "started", "start_end")}
    gaps: dict[str, list[float]] = {
        k: []
        for k in (
            "enqueue -> claim_begin",
            "claim (its statement)",
            "claim_end -> start_begin",
            "start_begin -> started",
        )
    }
    for job_id, enqueued, started in jobs:
        if job_id not in claimed_by or job_id not in starts:
            continue
        cb, ce = claimed_by[job_id]
        sb, se = starts[job_id]
        for name, t in (
            ("claim_begin", cb),
            ("claim_end", ce),
            ("start_begin", sb),
            ("started", started),
            ("start_end", se),
        ):
            steps[name].append((t - enqueued) * 1000)
        gaps["enqueue -> claim_begin"].append((cb - enqueued) * 1000)
        gaps["claim (its statement)"].append((ce - cb) * 1000)
        gaps["claim_end -> start_begin"].append((sb - ce) * 1000)
        gaps["start_begin -> started"].append((started - sb) * 1000)
    print(f"{len(steps['started'])} jobs traced at {args.rate:g}/s, load {os.getloadavg()[0]:.2f}")
    print("offset from enqueued_at (ms):   p50     p90     p99")
    for name, values in steps.items():
        print(f"  {name:28s} {q(values, 0.5):7.2f} {q(values, 0.9):7.2f} {q(values, 0.99):7.2f}")
    print("gaps (ms):")
    for name, values in gaps.items():
        print(f"  {name:28s} {q(values, 0.5):7.2f} {q(values, 0.9):7.2f} {q(values, 0.99):7.2f}")
    # The tail: where the slowest 2 % of pickups spent their time, and how
    # many came while a claim was already in flight (they wait for it).
    traced = [
        (started - enqueued, job_id, enqueued)
        for job_id, enqueued, started in jobs
        if job_id in claimed_by and job_id in starts
    ]
    tail = sorted(traced, reverse=True)[: max(1, len(traced) // 50)]
    if tail:
        print(f"the slowest {len(tail)} pickups (from {tail[-1][0] * 1000:.2f} ms), mean ms of each gap:")
        for name, part in (
            ("enqueue -> claim_begin", lambda j, e: claimed_by[j][0] - e),
            ("claim (its statement)", lambda j, e: claimed_by[j][1] - claimed_by[j][0]),
            ("claim_end -> start_begin", lambda j, e: starts[j][0] - claimed_by[j][1]),
        ):
            print(f"  {name:28s} {statistics.fmean(part(j, e) for _, j, e in tail) * 1000:7.2f}")
        busy = sum(1 for _, j, e in tail if any(b < e < end and j not in ids for b, end, ids in claims))
        print(f"  came while another claim was in flight: {busy} of {len(tail)}")
    durations = [(e - b) * 1000 for b, e, _ in claims]
    empty = sum(1 for _, _, ids in claims if not ids)
    print(
        f"claims: {len(claims)} ({empty} took nothing), statement p50 {q(durations, 0.5):.2f} ms, "
        f"p99 {q(durations, 0.99):.2f} ms, mean {statistics.fmean(durations):.2f} ms"
    )
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "pickup_trace.json").write_text(
        json.dumps({k: {"p50": q(v, 0.5), "p99": q(v, 0.99)} for k, v in {**steps, **gaps}.items()}, indent=1)
    )


if __name__ == "__main__":
    main()
