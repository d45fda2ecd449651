"""Join-to-fair-share (issue 13): two workers started together, and a worker
joining a busy cluster, with the default HEARTBEAT (10 s) and LEASE_TTL (30 s).

    .venv/bin/python bench/fairshare.py [--rounds 3] [--jobs 20000] [--join-jobs 60000]

* **together**: ``--jobs`` READY no-op jobs, then two ``shardq_worker``
  commands started at the same instant (separate commands, not
  ``--processes``); start → done rate against one worker's on the same
  backlog (alternated rounds), and each worker's share of the jobs.
* **join**: one worker drains ``--join-jobs``; once it holds every shard and
  runs, a second starts. Measured on the database's clock: from the second
  worker's registration to it holding its fair share (32 of 64); the longest
  time any shard was unowned or expired during the handover (a sampler reads
  ``shardq_shard`` every few milliseconds); and whether any job ran twice
  (``attempts`` and ``worker_ids`` of every job).

Prints one JSON document (medians and every round) and a short table. Used by
``make bench`` (phase ``fairshare``) and on its own.
"""

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHARDS = 64


def together(bench, jobs: int) -> dict:
    """Two worker commands started at once on ``jobs`` READY jobs."""
    from bench import limit

    bench.reset()
    limit.fill(bench.url, jobs)
    started = time.perf_counter()
    procs = [bench.start_worker(1, name=f"together-{i}") for i in range(2)]
    try:
        bench.wait_empty(timeout=max(300.0, jobs / 50), proc=procs[0])
        wall = time.perf_counter() - started
    finally:
        for proc in procs:
            bench.stop_worker(proc)
    shares = sorted(
        (n for (n,) in bench.sql("SELECT count(*) FROM shardq_job GROUP BY worker_ids->>0")),
        reverse=True,
    )
    return {"wall_s": wall, "rate": jobs / wall, "shares": [n / jobs for n in shares] + [0.0] * (2 - len(shares))}


def alone(bench, jobs: int) -> dict:
    from bench import limit

    bench.reset()
    limit.fill(bench.url, jobs)
    started = time.perf_counter()
    proc = bench.start_worker(1, name="alone")
    try:
        bench.wait_empty(timeout=max(300.0, jobs / 50), proc=proc)
        wall = time.perf_counter() - started
    finally:
        bench.stop_worker(proc)
    return {"wall_s": wall, "rate": jobs / wall}


class LeaseSampler(threading.Thread):
    """Reads every lease row every few milliseconds (its own connection) and
    records, per shard, each stretch of time (database clock) it had no live owner."""

    def __init__(self, url: str, interval: float = 0.003):
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, application_name="fairshare-sampler")
        self.interval = interval
        self.stop = threading.Event()
        self.samples: list[tuple[float, dict[int, str | None]]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            rows = self.conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::float8, shard,"
                " CASE WHEN lease_expires > clock_timestamp() THEN owner::text END"
                " FROM shardq_shard WHERE pool = '*' AND shard < %s",
                (SHARDS,),
            ).fetchall()
            if rows:
                self.samples.append((rows[0][0], {shard: owner for _, shard, owner in rows}))
            time.sleep(self.interval)
        self.conn.close()

    def longest_unowned(self, since: float) -> float:
        """Longest stretch (seconds) a shard was seen without a live owner after ``since``."""
        longest, gap_start = 0.0, {}
        for at, owners in self.samples:
            if at < since:
                continue
            for shard, owner in owners.items():
                if owner is None:
                    gap_start.setdefault(shard, at)
                elif shard in gap_start:
                    longest = max(longest, at - gap_start.pop(shard))
        return longest

    def first_time(self, worker: str, count: int, since: float) -> float | None:
        for at, owners in self.samples:
            if at >= since and sum(1 for o in owners.values() if o == worker) >= count:
                return at
        return None


def join(bench, jobs: int) -> dict:
    """A second worker joins one that is draining ``jobs``."""
    from bench import limit

    bench.reset()
    limit.fill(bench.url, jobs)
    first = bench.start_worker(1, name="join-first")
    sampler = LeaseSampler(bench.url)
    second = None
    try:
        bench.wait_for(lambda: bench.shards_held() == SHARDS, 60, "the first worker to hold every shard", first)
        bench.wait_for(
            lambda: bench.sql("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] > 1000,
            60,
            "the first worker to run jobs",
            first,
        )
        sampler.start()
        second = bench.start_worker(1, name="join-second")
        bench.wait_for(
            lambda: bench.sql("SELECT count(*) FROM shardq_worker")[0][0] == 2, 60, "the second worker to register"
        )
        (worker, registered) = bench.sql(
            "SELECT id::text, extract(epoch FROM started_at)::float8 FROM shardq_worker ORDER BY started_at DESC LIMIT 1"
        )[0]
        bench.wait_for(
            lambda: sampler.first_time(worker, SHARDS // 2, registered) is not None or not bench.pending(),
            60,
            "the second worker to hold its fair share",
            second,
        )
        time.sleep(0.5)  # samples after the handover, for the unowned stretches
        sampler.stop.set()
        sampler.join(timeout=5)
        fair_at = sampler.first_time(worker, SHARDS // 2, registered)
        bench.wait_empty(timeout=max(300.0, jobs / 50), proc=first)
        twice = bench.sql(
            "SELECT count(*) FROM shardq_job WHERE attempts <> 1 OR jsonb_array_length(worker_ids) <> 1"
            " OR status <> 'SUCCESSFUL'"
        )[0][0]
    finally:
        sampler.stop.set()
        bench.stop_worker(first)
        if second is not None:
            bench.stop_worker(second)
    return {
        "seconds_to_fair_share": None if fair_at is None else fair_at - registered,
        "longest_unowned_s": sampler.longest_unowned(registered),
        "jobs_not_run_exactly_once": twice,
    }


def run(bench, rounds: int, jobs: int, join_jobs: int) -> dict:
    out: dict = {"alone": [], "together": [], "join": []}
    for _ in range(rounds):
        # Alternated: one worker, two workers, the join; then again.
        out["alone"].append(alone(bench, jobs))
        out["together"].append(together(bench, jobs))
        out["join"].append(join(bench, join_jobs))
    med = statistics.median
    out["summary"] = {
        "two_over_one": med(t["rate"] for t in out["together"]) / med(a["rate"] for a in out["alone"]),
        "larger_share": med(t["shares"][0] for t in out["together"]),
        "seconds_to_fair_share": med(
            j["seconds_to_fair_share"] if j["seconds_to_fair_share"] is not None else float("inf") for j in out["join"]
        ),
        "longest_unowned_s": max(j["longest_unowned_s"] for j in out["join"]),
        "jobs_not_run_exactly_once": sum(j["jobs_not_run_exactly_once"] for j in out["join"]),
    }
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="bench/fairshare.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--join-jobs", type=int, default=60_000)
    p.add_argument("--database", default="shardq_bench_fairshare")
    args = p.parse_args(argv)

    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench.e2e import Bench, Options, bench_database

    bench = Bench(Options(database_url=bench_database(args.database)))
    out = run(bench, args.rounds, args.jobs, args.join_jobs)
    print(json.dumps(out, indent=2))
    s = out["summary"]
    print(
        f"2 workers / 1: {s['two_over_one']:.2f}x   larger share: {s['larger_share']:.0%}   "
        f"join → fair share: {s['seconds_to_fair_share']:.3f} s   longest unowned: "
        f"{s['longest_unowned_s'] * 1000:.0f} ms   not exactly once: {s['jobs_not_run_exactly_once']}"
    )


if __name__ == "__main__":
    main()
