"""Fair share inside a queue at full size (issue 25, docs/fairness.md).

    .venv/bin/python bench/fairness.py [--cases cost,noisy] [--rounds 3] [--jobs 20000]

* **cost**: ``--jobs`` READY no-op jobs drained by one worker
  (``--concurrency 4``), every job its own fair key (every claim walks as
  many keys as it takes jobs, the local queue keeps a flow a job) against
  the same jobs with no fair key; alternated rounds. Target: >= 0.85x.
  Rate = jobs / (first start .. last finish, from the rows).
* **noisy**: the noisy neighbour, scenario 1. Tenant A's ``--noisy`` jobs of
  10 ms are READY, then two workers (``--concurrency 4``) start and tenant
  B enqueues one job every 100 ms for ``--seconds`` (30). Reported: B's
  pickups (started_at - enqueued_at: p50, p99, max) and A's throughput
  while B ran, fairness on (A's and B's rows carry their fair keys) and
  off (no fair key: FIFO). Targets: B's p99 <= 100 ms, A >= 0.9x off.

* **many**: scenario 3, many tenants. ``--tenants`` (1,000) backlogged
  tenants of ``--per-tenant`` (20) no-op jobs each, written READY tenant
  after tenant, drained by one worker (``--concurrency 4``, metrics on),
  fairness on (each job's fair key its tenant) and off (none: FIFO, tenant
  after tenant). Reported: each tenant's share of the first half of the
  starts (while every tenant still has a backlog: equal is
  ``--per-tenant`` / 2 each), its spread against equal (target: every
  tenant within +-20 %), and the claim's statements (``claim_jobs`` round
  trips, from the worker's ``shardq_claim_duration_seconds``) and time per
  job, with the drain rate, on against off.

Prints one JSON document and a line per case. ``make fairness`` runs it
and the acceptance tests at full size (SHARDQ_FAIRNESS_FULL=1).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NOOP = "tests.taskapp.tasks.noop"
TENANT = "tests.taskapp.fair_tasks.tenant_job"


def fill(bench, task: str, n: int, fair: str | None, kwargs: str = "{}") -> None:
    """``n`` READY jobs of ``task`` in one statement (setup, not measured);
    ``fair``: None (no fair key), 'own' (every job its own) or a key."""
    bench.sql(
        """
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
            key_hash, ordered, status, status_rank, fence, attempts, max_attempts,
            args, kwargs, errors, worker_ids, enqueued_at, fair_key)
        SELECT %(task)s::text, 'default', 'default', 0, t, h & 63, h, false, 'READY', 0, 0, 0, 1,
               '[]'::jsonb, %(kwargs)s::jsonb, '[]'::jsonb, '[]'::jsonb, t,
               CASE WHEN %(fair)s::text = 'own' THEN 'k' || g WHEN %(fair)s::text IS NOT NULL THEN %(fair)s::text END
        FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, g, clock_timestamp() AS t
              FROM generate_series(1, %(n)s) AS g) AS g
        """,
        {"task": task, "n": n, "fair": fair, "kwargs": kwargs},
    )
    bench.sql("ANALYZE shardq_job")


def drain(bench, n: int, fair: bool) -> dict:
    bench.reset()
    fill(bench, NOOP, n, "own" if fair else None)
    proc = bench.start_worker(1, name="fairness-cost", concurrency=4)
    try:
        bench.wait_empty(timeout=max(300.0, n / 20), proc=proc)
    finally:
        bench.stop_worker(proc)
    done, first, last = bench.sql(
        "SELECT count(*), extract(epoch FROM min(last_attempted_at))::float8,"
        " extract(epoch FROM max(finished_at))::float8 FROM shardq_job WHERE status = 'SUCCESSFUL'"
    )[0]
    return {"jobs": done, "rate": done / (last - first)}


def cost(bench, rounds: int, jobs: int) -> dict:
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(rounds):
        for side in ("off", "on") if i % 2 == 0 else ("on", "off"):
            runs[side].append(drain(bench, jobs, side == "on"))
            bench.step(f"fairness: cost {side}")
    ratios = [on["rate"] / off["rate"] for on, off in zip(runs["on"], runs["off"], strict=True)]
    return {
        "on_rate": statistics.median(r["rate"] for r in runs["on"]),
        "off_rate": statistics.median(r["rate"] for r in runs["off"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


def noisy_run(bench, noisy: int, seconds: float, fair: bool) -> dict:
    bench.reset()
    fill(bench, TENANT, noisy, "A" if fair else None, '{"tenant": "A", "sleep": 0.01}')
    procs = [bench.start_worker(1, name=f"fairness-noisy-{i}", concurrency=4) for i in range(2)]
    quiet: list[int] = []
    try:
        # A's backlog running on both workers first.
        deadline = time.monotonic() + 60
        while bench.sql("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] < 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the noisy backlog did not start")
            time.sleep(0.05)
        began = time.monotonic()
        window_start = bench.sql("SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
        for i in range(int(seconds * 10)):
            time.sleep(max(0.0, began + 0.1 * i - time.monotonic()))  # the load's pace
            [(job_id,)] = bench.sql(
                """
                WITH job AS (
                    INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                        key_hash, ordered, status, status_rank, fence, attempts, max_attempts,
                        args, kwargs, errors, worker_ids, enqueued_at, fair_key)
                    SELECT %(task)s, 'default', 'default', 0, clock_timestamp(), h & 63, h, false, 'READY',
                           0, 0, 0, 1, '[]'::jsonb, '{"tenant": "B", "sleep": 0.01}'::jsonb, '[]'::jsonb,
                           '[]'::jsonb, clock_timestamp(), %(fair)s
                    FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h) AS r
                    RETURNING id, shard)
                SELECT id FROM job, LATERAL pg_notify('shardq', job.shard || ':0') AS n
                """,
                {"task": TENANT, "fair": "B" if fair else None},
            )
            quiet.append(job_id)
        window_end = bench.sql("SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
        deadline = time.monotonic() + 600
        while bench.sql("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [quiet])[0][
            0
        ] < len(quiet):
            if time.monotonic() > deadline:
                raise RuntimeError("B's jobs did not finish")
            time.sleep(0.05)
    finally:
        for proc in procs:
            bench.stop_worker(proc)
    pickups = sorted(
        p
        for (p,) in bench.sql(
            "SELECT extract(epoch FROM started_at - enqueued_at)::float8 FROM shardq_job WHERE id = ANY(%s)", [quiet]
        )
    )
    [(a_done,)] = bench.sql(
        "SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL' AND NOT (id = ANY(%s))"
        " AND finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
        [quiet, window_start, window_end],
    )
    return {
        "b_p50_ms": 1000 * pickups[len(pickups) // 2],
        "b_p99_ms": 1000 * pickups[min(len(pickups) - 1, int(0.99 * len(pickups)))],
        "b_max_ms": 1000 * pickups[-1],
        "a_rate": a_done / (window_end - window_start),
    }


def noisy(bench, jobs: int, seconds: float) -> dict:
    on = noisy_run(bench, jobs, seconds, fair=True)
    bench.step("fairness: noisy on")
    off = noisy_run(bench, jobs, seconds, fair=False)
    bench.step("fairness: noisy off")
    return {"on": on, "off": off, "a_ratio": on["a_rate"] / off["a_rate"]}


def scrape(port: int) -> dict[str, float]:
    """The worker's claim histogram: round trips and their seconds."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        for name in ("shardq_claim_duration_seconds_count", "shardq_claim_duration_seconds_sum"):
            if line.startswith(name + " "):
                found[name.rsplit("_", 1)[1]] = float(line.split()[1])
    return found


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def many_run(bench, tenants: int, per: int, fair: bool) -> dict:
    bench.reset()
    n = tenants * per
    bench.sql(
        """
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
            key_hash, ordered, status, status_rank, fence, attempts, max_attempts,
            args, kwargs, errors, worker_ids, enqueued_at, fair_key)
        SELECT %(task)s::text, 'default', 'default', 0, t, h & 63, h, false, 'READY', 0, 0, 0, 1,
               '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, t,
               CASE WHEN %(fair)s THEN 't' || ((g - 1) / %(per)s) END
        FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, g, clock_timestamp() AS t
              FROM generate_series(1, %(n)s) AS g) AS g
        ORDER BY g
        """,
        {"task": NOOP, "n": n, "per": per, "fair": fair},
    )
    bench.sql("ANALYZE shardq_job")
    port = free_port()
    proc = bench.start_worker(
        1, name=f"fairness-many-{'on' if fair else 'off'}", concurrency=4, flags=("--metrics-port", str(port))
    )
    try:
        bench.wait_empty(timeout=max(300.0, n / 20), proc=proc)
        claims = scrape(port)
    finally:
        bench.stop_worker(proc)
    # The tenant of a job: its place in the insert (ids follow it), per jobs a tenant.
    [(done, first, last)] = bench.sql(
        "SELECT count(*), extract(epoch FROM min(last_attempted_at))::float8,"
        " extract(epoch FROM max(finished_at))::float8 FROM shardq_job WHERE status = 'SUCCESSFUL'"
    )
    half = bench.sql(
        """
        WITH jobs AS (SELECT (id - min(id) OVER ()) / %(per)s AS tenant, last_attempted_at FROM shardq_job),
             early AS (SELECT tenant FROM jobs ORDER BY last_attempted_at, tenant LIMIT %(half)s)
        SELECT count(early.tenant) FROM generate_series(0, %(tenants)s - 1) AS t(tenant)
        LEFT JOIN early USING (tenant) GROUP BY t.tenant
        """,
        {"per": per, "half": n // 2, "tenants": tenants},
    )
    equal = per / 2
    shares = sorted(row[0] / equal for row in half)
    within = sum(1 for x in shares if 0.8 <= x <= 1.2)
    return {
        "jobs": done,
        "rate": done / (last - first),
        "share_min": shares[0],
        "share_p1": shares[len(shares) // 100],
        "share_p99": shares[min(len(shares) - 1, 99 * len(shares) // 100)],
        "share_max": shares[-1],
        "tenants_within_20pct": within,
        "tenants": tenants,
        "claims": claims.get("count", 0.0),
        "claims_per_job": claims.get("count", 0.0) / done,
        "claim_ms_per_job": 1000 * claims.get("sum", 0.0) / done,
    }


def many(bench, tenants: int, per: int, rounds: int) -> dict:
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(rounds):
        for side in ("off", "on") if i % 2 == 0 else ("on", "off"):
            runs[side].append(many_run(bench, tenants, per, side == "on"))
            bench.step(f"fairness: many {side}")
    return {
        "runs": runs,
        "rate_ratio": statistics.median(
            on["rate"] / off["rate"] for on, off in zip(runs["on"], runs["off"], strict=True)
        ),
    }


CASES = ("cost", "noisy", "many")


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/fairness.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--noisy", type=int, default=50000, help="tenant A's backlog for the noisy case")
    p.add_argument("--seconds", type=float, default=30.0, help="how long B enqueues in the noisy case")
    p.add_argument("--tenants", type=int, default=1000, help="backlogged tenants in the many case")
    p.add_argument("--per-tenant", type=int, default=20, help="jobs a tenant in the many case")
    p.add_argument("--database", default="shardq_bench")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    args = p.parse_args()
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    url = e2e.bench_database(args.database)
    options = e2e.Options(database_url=url, phases=("fairness",), write_docs=False, rounds=args.rounds, jobs=args.jobs)
    bench = e2e.Bench(options)
    started = time.monotonic()
    raw: dict = {}
    try:
        if "cost" in cases:
            raw["cost"] = cost(bench, args.rounds, args.jobs)
        if "noisy" in cases:
            raw["noisy"] = noisy(bench, args.noisy, args.seconds)
        if "many" in cases:
            raw["many"] = many(bench, args.tenants, args.per_tenant, args.rounds)
    finally:
        bench.reset()
        bench.conn.close()
    raw["seconds"] = time.monotonic() - started
    print(json.dumps(raw, indent=2))
    if "cost" in raw:
        r = raw["cost"]
        print(
            f"cost: no-op drain, every job its own fair key: {r['on_rate']:.0f} vs {r['off_rate']:.0f} jobs/s "
            f"without, ratio {r['ratio']:.2f} (rounds {', '.join(f'{x:.2f}' for x in r['ratios'])})"
        )
    if "noisy" in raw:
        r = raw["noisy"]
        for side in ("on", "off"):
            s = r[side]
            print(
                f"noisy neighbour, fairness {side}: B pickup p50 {s['b_p50_ms']:.0f} ms, p99 {s['b_p99_ms']:.0f} ms, "
                f"max {s['b_max_ms']:.0f} ms; A {s['a_rate']:.0f} jobs/s"
            )
        print(f"noisy neighbour: A's throughput with fairness {r['a_ratio']:.2f}x without")
    if "many" in raw:
        for side in ("on", "off"):
            for s in raw["many"]["runs"][side]:
                print(
                    f"many tenants, fairness {side}: {s['tenants_within_20pct']}/{s['tenants']} tenants within "
                    f"+-20 % of equal in the first half of the starts (share min {s['share_min']:.2f}, "
                    f"p1 {s['share_p1']:.2f}, p99 {s['share_p99']:.2f}, max {s['share_max']:.2f} of equal); "
                    f"{s['rate']:.0f} jobs/s; {s['claims_per_job']:.3f} claims a job, "
                    f"{s['claim_ms_per_job']:.3f} ms of claim a job"
                )
        print(f"many tenants: drain rate with fairness {raw['many']['rate_ratio']:.2f}x without")


if __name__ == "__main__":
    main()
