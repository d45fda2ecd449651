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

* **kill**: scenario 5, the noisy case on 3 workers with one SIGKILLed
  halfway through B's run (``--lease-ttl``: 30 s, the default); the tasks
  write a ledger. Reported: jobs lost, jobs run to their end twice, B's
  pickups over all and without the jobs the dead worker's leases held.
* **global**: a heavy key H and a light key L, both backlogged
  (``--global-jobs`` of 10 ms each), on 3 workers of 4 threads: confined
  (H's jobs on one shard, L's on one of another owner) or spread over
  every shard, L's weight 1 or 3. Reported: each key's share of the
  starts and each worker's rate while both had a backlog.

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


def parent_of(pid: int) -> int:
    """A process's parent pid (0: gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def owned(bench, procs) -> dict[int, set[int]]:
    """Each started process's pid -> the shards its worker holds (the bench
    starts ``--processes 1``: a supervisor whose one child is the worker)."""
    rows = bench.sql(
        "SELECT w.pid, s.shard FROM shardq_shard AS s JOIN shardq_worker AS w ON w.id = s.owner"
        " WHERE s.pool = '*' AND s.lease_expires > clock_timestamp()"
    )
    held: dict[int, set[int]] = {proc.pid: set() for proc in procs}
    for pid, shard in rows:
        held.setdefault(parent_of(pid), set()).add(shard)
    return held


def worker_pids(bench, procs) -> dict[int, int]:
    """Each started process's pid -> its worker child's pid."""
    return {parent_of(pid): pid for (pid,) in bench.sql("SELECT pid FROM shardq_worker WHERE state = 'RUNNING'")}


def wait_shares(bench, procs, timeout: float = 120) -> dict[int, set[int]]:
    """Wait until every worker holds its share of the 64 shards (21/21/22)."""
    deadline = time.monotonic() + timeout
    while True:
        held = owned(bench, procs)
        counts = sorted(len(held.get(proc.pid, ())) for proc in procs)
        if sum(counts) == 64 and counts[-1] - counts[0] <= 1:
            return held
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not settle on their shares: {counts}")
        time.sleep(0.1)


def db_now(bench) -> float:
    return bench.sql("SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]


def enqueue_b(bench, fair: bool) -> int:
    """One of B's jobs, READY now, with its NOTIFY (as enqueue sends it)."""
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
    return job_id


def kill(bench, noisy_jobs: int, seconds: float, lease_ttl: float) -> dict:
    """Scenario 5: the noisy neighbour on 3 workers, one SIGKILLed halfway
    through B's run. The tasks write a ledger (start and end of every run),
    read after the drain: jobs lost (not SUCCESSFUL, or never run to their
    end), run to their end twice, and B's pickups: over all of B's jobs, and
    without those enqueued after the kill on the dead worker's shards (they
    wait for the takeover: dead-owner detection's, a fraction of a second;
    with SHARDQ_DEAD_OWNER_DETECTION=false in the environment, the leases'
    expiry, ``lease_ttl``); and how long after the kill the last of the dead
    worker's shards was taken over."""
    import os
    import signal
    import tempfile

    bench.reset()
    fill(bench, TENANT, noisy_jobs, "A", '{"tenant": "A", "sleep": 0.01}')
    ledger = Path(tempfile.mkdtemp(prefix="shardq-fair-kill-")) / "ledger"
    env = {
        "SHARDQ_LIMIT_LEDGER": str(ledger),
        "SHARDQ_LEASE_TTL": str(lease_ttl),
        "SHARDQ_HEARTBEAT": str(lease_ttl / 3),
        "SHARDQ_EXPECTED_WORKERS": "3",
    }
    procs = [bench.start_worker(1, env=env, name=f"fairness-kill-{i}", concurrency=4) for i in range(3)]
    quiet: list[int] = []
    try:
        wait_shares(bench, procs)
        deadline = time.monotonic() + 60
        while bench.sql("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] < 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the noisy backlog did not start")
            time.sleep(0.05)
        victim = procs[1]
        killed_at, dead_shards, child = 0.0, set(), 0
        began = time.monotonic()
        steps = int(seconds * 10)
        for i in range(steps):
            time.sleep(max(0.0, began + 0.1 * i - time.monotonic()))  # the load's pace
            if i == steps // 2:
                dead_shards = owned(bench, procs)[victim.pid]
                child = worker_pids(bench, procs)[victim.pid]
                killed_at = db_now(bench)
                # The machine dies: the supervisor first (it would restart
                # its child), then the worker (a process group of its own).
                os.killpg(victim.pid, signal.SIGKILL)
                os.killpg(child, signal.SIGKILL)
                victim.wait(timeout=10)
            quiet.append(enqueue_b(bench, True))
        bench.wait_empty(timeout=max(600.0, noisy_jobs / 20), proc=procs[0])
    finally:
        for proc in procs:
            bench.stop_worker(proc)
    jobs = bench.sql("SELECT id, status, shard, extract(epoch FROM enqueued_at)::float8, worker_losses FROM shardq_job")
    # When the dead worker's shards were all taken over (dead-owner detection:
    # a fraction of a second; without it, its leases' expiry).
    [(taken, last_taken)] = bench.sql(
        "SELECT count(*), extract(epoch FROM max(at))::float8 FROM shardq_shard_event "
        "WHERE reason = 'takeover' AND shard = ANY(%s) AND at >= to_timestamp(%s)",
        [sorted(dead_shards), killed_at],
    )
    ends: dict[int, list[int]] = {}
    first_start: dict[int, float] = {}
    for line in ledger.read_text().splitlines():
        event, job, when, pid, *_ = line.split()
        if event == "end":
            ends.setdefault(int(job), []).append(int(pid))
        elif int(job) not in first_start or float(when) < first_start[int(job)]:
            first_start[int(job)] = float(when)
    quiet_set = set(quiet)
    pickups, served, held_up = [], [], []
    for job, _, shard, enqueued, _ in jobs:
        if job in quiet_set:
            pickup = first_start[job] - enqueued
            pickups.append(pickup)
            if enqueued >= killed_at and shard in dead_shards:
                held_up.append(pickup)
            else:
                served.append(pickup)
    pickups.sort()
    served.sort()
    twice = [job for job, pids in ends.items() if len(pids) > 1]
    victim_pid = child
    return {
        "lease_ttl": lease_ttl,
        "jobs": len(jobs),
        "lost": sum(1 for job, status, *_ in jobs if status != "SUCCESSFUL" or job not in ends),
        "ran_to_end_twice": len(twice),
        "twice_first_on_killed_worker": sum(1 for job in twice if ends[job][0] == victim_pid),
        "rerun_after_loss": sum(1 for *_, losses in jobs if losses),
        "dead_shards": len(dead_shards),
        "taken_over": taken,
        "takeover_s": (last_taken - killed_at) if last_taken is not None else None,
        "b_jobs": len(pickups),
        "b_p50_ms": 1000 * pct(pickups, 0.5),
        "b_p99_ms": 1000 * pct(pickups, 0.99),
        "b_max_ms": 1000 * pickups[-1],
        "b_held_up": len(held_up),
        "b_held_up_max_ms": 1000 * max(held_up, default=0.0),
        "b_served_p50_ms": 1000 * pct(served, 0.5),
        "b_served_p99_ms": 1000 * pct(served, 0.99),
        "b_served_max_ms": 1000 * served[-1],
    }


def pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def global_run(bench, jobs: int, confined: bool, light_weight: int) -> dict:
    """Heavy key H and light key L, both backlogged (``jobs`` of 10 ms
    each), L's jobs of weight ``light_weight``, on 3 workers of 4 threads.
    ``confined``: H's jobs all on one shard and L's on one of another
    worker (the shard key is the tenant: they hash to different owners);
    else both spread over every shard. Reported: each key's share of the
    starts and each worker's jobs a second while both had a backlog."""
    bench.reset()
    procs = [bench.start_worker(1, name=f"fairness-global-{i}", concurrency=4) for i in range(3)]
    try:
        held = wait_shares(bench, procs)
        owners = [pid for pid in held if held[pid]]
        h_shard, l_shard = min(held[owners[0]]), min(held[owners[1]])
        bench.sql(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at, fair_key, fair_weight)
            SELECT %(task)s::text, 'default', 'default', 0, clock_timestamp(),
                   CASE WHEN %(confined)s THEN CASE WHEN k.key = 'H' THEN %(h)s ELSE %(l)s END ELSE h & 63 END,
                   h, false, 'READY', 0, 0, 0, 1, '[]'::jsonb,
                   jsonb_build_object('tenant', k.key, 'sleep', 0.01), '[]'::jsonb, '[]'::jsonb, clock_timestamp(),
                   k.key, k.weight
            FROM (VALUES ('H', NULL::int), ('L', %(w)s::int)) AS k(key, weight),
                 LATERAL (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, g
                          FROM generate_series(1, %(n)s) AS g) AS g
            ORDER BY g, k.key
            """,
            {"task": TENANT, "n": jobs, "confined": confined, "h": h_shard, "l": l_shard, "w": light_weight},
        )
        bench.sql("SELECT pg_notify('shardq', s || ':0') FROM generate_series(0, 63) AS s")
        bench.wait_empty(timeout=max(600.0, jobs / 10), proc=procs[0])
    finally:
        for proc in procs:
            bench.stop_worker(proc)
    # While both had a backlog: up to the first key's last start.
    [(end,)] = bench.sql(
        "SELECT min(last) FROM (SELECT max(started_at) AS last FROM shardq_job GROUP BY fair_key) AS k"
    )
    [(first,)] = bench.sql("SELECT min(started_at) FROM shardq_job")
    window = (end - first).total_seconds()
    starts = dict(bench.sql("SELECT fair_key, count(*) FROM shardq_job WHERE started_at < %s GROUP BY fair_key", [end]))
    per_worker = bench.sql(
        "SELECT j.worker_ids->>0, count(*) FROM shardq_job AS j WHERE j.started_at < %s GROUP BY 1", [end]
    )
    total = sum(starts.values())
    return {
        "confined": confined,
        "light_weight": light_weight,
        "window_s": window,
        "h_share": starts.get("H", 0) / total,
        "l_share": starts.get("L", 0) / total,
        "jobs_per_s": total / window,
        "per_worker_jobs_per_s": sorted((n / window for _, n in per_worker), reverse=True)
        + [0.0] * (3 - len(per_worker)),
    }


def global_share(bench, jobs: int) -> dict:
    runs = {}
    for confined in (True, False):
        for weight in (1, 3):
            runs[f"{'confined' if confined else 'spread'}_w{weight}"] = global_run(bench, jobs, confined, weight)
            bench.step(f"fairness: global {confined} {weight}")
    return runs


CASES = ("cost", "noisy", "many", "kill", "global")


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/fairness.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--noisy", type=int, default=50000, help="tenant A's backlog for the noisy case")
    p.add_argument("--seconds", type=float, default=30.0, help="how long B enqueues in the noisy case")
    p.add_argument("--tenants", type=int, default=1000, help="backlogged tenants in the many case")
    p.add_argument("--per-tenant", type=int, default=20, help="jobs a tenant in the many case")
    p.add_argument("--lease-ttl", type=float, default=30.0, help="the kill case's LEASE_TTL (the default's 30 s)")
    p.add_argument("--global-jobs", type=int, default=3000, help="jobs of each key in the global case")
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
        if "kill" in cases:
            raw["kill"] = kill(bench, args.noisy, args.seconds, args.lease_ttl)
        if "global" in cases:
            raw["global"] = global_share(bench, args.global_jobs)
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
    if "kill" in raw:
        r = raw["kill"]
        print(
            f"across a SIGKILL (3 workers, LEASE_TTL {r['lease_ttl']:g} s): the dead worker's {r['dead_shards']} shards "
            f"taken over {r['takeover_s']:.2f} s after the kill; {r['lost']} of {r['jobs']} jobs lost, "
            f"{r['ran_to_end_twice']} ran to their end twice ({r['twice_first_on_killed_worker']} first on the "
            f"killed worker); B pickup p50 {r['b_p50_ms']:.0f} ms, p99 {r['b_p99_ms']:.0f} ms, max "
            f"{r['b_max_ms']:.0f} ms over {r['b_jobs']}; without the {r['b_held_up']} enqueued on the dead "
            f"worker's shards after the kill (max {r['b_held_up_max_ms']:.0f} ms): p50 {r['b_served_p50_ms']:.0f} ms, "
            f"p99 {r['b_served_p99_ms']:.0f} ms, max {r['b_served_max_ms']:.0f} ms"
        )
    if "global" in raw:
        for name, r in raw["global"].items():
            print(
                f"global share, {name} (L's weight {r['light_weight']}): H {r['h_share']:.0%}, L {r['l_share']:.0%} "
                f"of the starts over {r['window_s']:.1f} s with both backlogged; {r['jobs_per_s']:.0f} jobs/s, "
                f"per worker {', '.join(f'{x:.0f}' for x in r['per_worker_jobs_per_s'])}"
            )


if __name__ == "__main__":
    main()
