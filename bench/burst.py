"""A burst into an idle, running worker (issue 24): first start -> last done.

    DATABASE_URL=... .venv/bin/python bench/burst.py [--jobs 20000] [--rounds 3]

Each round, alternated: (1) the bare-SQL limit (bench/limit.py's Drainer,
one connection that claims, writes each job's start as it begins it, calls
noop() and acks in batches of 256) polling an empty queue; (2) the same loop
with the pre-issue-24 start-ahead claim (the claim writes every start);
(3) ``manage.py shardq_worker --concurrency 4`` started and idle, holding
every shard. Then one INSERT makes the burst READY and the clock is the
jobs' own: first ``started_at`` (``last_attempted_at`` for the limit's
claim-started jobs) to last ``finished_at``, both the database's clock.
Prints medians and shardq ÷ limit (median of per-round ratios); writes
bench/results/burst.json.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from bench import limit  # noqa: E402


def sql(url: str, text: str, params=None) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []


def reset(url: str) -> None:
    sql(url, "TRUNCATE shardq_job, shardq_shard_event")
    sql(url, "DELETE FROM shardq_worker")
    sql(url, "UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")


def span(url: str, n: int, timeout: float = 600.0) -> float:
    deadline = time.monotonic() + timeout
    while sql(url, "SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] < n:
        if time.monotonic() > deadline:
            raise RuntimeError("the burst did not drain in time")
        time.sleep(0.02)
    first, last = sql(
        url,
        "SELECT extract(epoch FROM min(COALESCE(started_at, last_attempted_at))), "
        "extract(epoch FROM max(finished_at)) FROM shardq_job",
    )[0]
    return float(last) - float(first)


def polling_limit(url: str, worker: str, shards: list[int], start_ahead: bool, stop) -> None:
    drainer = limit.Drainer(url, worker, shards, 256, start_ahead=start_ahead)
    drainer.warm()
    while not stop.is_set():
        if not drainer.drain_available():
            time.sleep(0.001)
    drainer.conn.close()


def limit_burst(url: str, n: int, start_ahead: bool) -> float:
    reset(url)
    worker = limit.new_worker_id()
    shards = list(range(limit.SHARD_COUNT))
    limit.own_shards(url, worker, shards)
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=polling_limit, args=(url, worker, shards, start_ahead, stop))
    proc.start()
    time.sleep(0.5)  # idle and polling
    limit.fill(url, n)
    try:
        return n / span(url, n)
    finally:
        stop.set()
        proc.join(timeout=30)


def shardq_burst(url: str, n: int) -> float:
    reset(url)
    env = {**os.environ, "DATABASE_URL": url, "SHARDQ_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "shardq_worker", "--concurrency", "4"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while sql(url, "SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL")[0][0] < limit.SHARD_COUNT:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the worker did not take the shards")
            time.sleep(0.02)
        time.sleep(0.5)  # idle and running
        limit.fill(url, n)
        return n / span(url, n)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/burst.py", description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    url = os.environ["DATABASE_URL"]
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, check=True)
    rows: dict[str, list[float]] = {"limit": [], "limit, start ahead": [], "shardq": []}
    for _ in range(args.rounds):
        rows["limit"].append(limit_burst(url, args.jobs, start_ahead=False))
        rows["limit, start ahead"].append(limit_burst(url, args.jobs, start_ahead=True))
        rows["shardq"].append(shardq_burst(url, args.jobs))
    ratio = statistics.median(s / lim for s, lim in zip(rows["shardq"], rows["limit"], strict=True))
    ahead = statistics.median(s / lim for s, lim in zip(rows["shardq"], rows["limit, start ahead"], strict=True))
    print(f"burst of {args.jobs:,} no-op jobs into an idle worker, first start -> last done (jobs/s, medians)")
    for name, values in rows.items():
        print(f"  {name:20s} {statistics.median(values):9,.0f}   ({', '.join(f'{v:,.0f}' for v in values)})")
    print(f"  shardq / limit {ratio:.2f}; shardq / start-ahead limit {ahead:.2f}")
    results = REPO / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "burst.json").write_text(json.dumps({"rounds": rows, "ratio": ratio, "ratio_start_ahead": ahead}))


if __name__ == "__main__":
    main()
