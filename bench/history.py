"""``make bench-history``: the figures of issue 27 §1 (docs/benchmarks.md, "History").

    .venv/bin/python bench/history.py [--rows 10000000] [--jobs 20000] [--rounds 4] [--baseline CHECKOUT]

1. **A drain beside 10M finished rows in history.** Two databases migrated
   by this checkout: ``shardq_hb_none`` (an empty history) and
   ``shardq_hb_10m`` (``--rows`` SUCCESSFUL jobs in history, half in each of
   the two days before today's partition: a day-partitioned history as it
   stands). Each round drains ``--jobs`` no-op jobs with one in-process
   worker in a fresh process (bench/history_drain.py) on each, the archiver
   moving them as they finish (``HISTORY_GRACE`` 0); the rounds alternate
   which goes first. The filled history is vacuumed and checkpointed
   before the first round. Target: the median ratio of rates ≥ 0.95.
2. **The hot path's CPU against today's.** With ``--baseline`` (a checkout
   of the code before history, e.g. ``git archive main``), a third database
   migrated by it, drained the same way in each round by its code: CPU per
   job of the worker process plus its database backends (read from /proc),
   reported twice on this side: the job's own path (the worker process and
   its connections, the archiver's connection left out: it works off the
   path, one per cluster, in batches) and everything (the archiver's
   statements included). Target: the hot path ≤ 1.05×.
3. **Dropping a day of 5M rows.** The older of the two filled days is
   dropped by the archiver's own statement (``maintain_history``: DETACH
   ... CONCURRENTLY, DROP TABLE), timed. Target: < 1 s. (The next run fills
   it again.)

By default (``--server own``) everything runs on a PostgreSQL of its own
(tests/pgserver.py), started and removed by the bench, configured as
production runs: fsync and autovacuum on. ``--server shared`` uses
``DATABASE_URL``'s server as it is (the shared development server has
autovacuum off: the filled day partitions are then never vacuumed, and the
drain beside them read 0.93x there in session 12). ``--calibrate`` drains a
second empty-history database each round: the spread of two equal
databases, the noise any ratio has to beat. Run the bench at ``nice -n
-10`` on a busy machine (its server inherits the priority).

Writes ``bench/results/history.json``. Reports the load average beside
every figure: the machine is shared.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def database_url(name: str) -> str:
    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/postgres")
    return base.rsplit("/", 1)[0] + "/" + name


def ensure_database(name: str, checkout: Path) -> str:
    import psycopg

    url = database_url(name)
    with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=checkout, env=env, check=True)
    return url


FILL = """
INSERT INTO shardq_job_history (id, task_path, backend, queue_name, priority, run_after, shard, key_hash, shard_key,
    ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, return_value, errors, worker_ids,
    enqueued_at, started_at, finished_at, last_attempted_at, worker_losses, children_pending, waiting_on, key_limited)
SELECT g, 'tests.taskapp.tasks.add', 'default', 'default', 0, t, (g %% 64)::smallint, (g %% 64)::int, NULL, false,
       'SUCCESSFUL', 3, 1, 1, 1, '[2, 3]', '{}', '5', '[]', '["6d1f2c3e-0b9a-4e8f-9c1d-2a3b4c5d6e7f"]', t, t, t, t,
       0, false, 0, false
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,
     LATERAL (SELECT %(day)s::timestamptz + make_interval(secs => (g - %(first)s) * 86399.0 / %(n)s)) AS x(t)
"""


def fill(url: str, rows: int) -> float:
    """``rows`` SUCCESSFUL jobs in the two days before today; seconds taken (0: there already)."""
    import psycopg

    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    days = [today - timedelta(days=2), today - timedelta(days=1)]
    with psycopg.connect(url, autocommit=True) as conn:
        ddl = conn.execute(
            "SELECT format('CREATE TABLE IF NOT EXISTS %%I PARTITION OF shardq_job_history FOR VALUES FROM (%%L) TO (%%L)',"
            " 'shardq_job_history_' || to_char(d AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS'), d, d + interval '1 day') "
            "FROM unnest(%s::timestamptz[]) AS d",
            [days],
        ).fetchall()
        for (statement,) in ddl:
            conn.execute(statement.encode())
        began = time.monotonic()
        filled = False
        per_day = rows // 2
        for i, day in enumerate(days):
            have = conn.execute(
                "SELECT count(*) FROM shardq_job_history WHERE finished_at >= %s AND finished_at < %s",
                [day, day + timedelta(days=1)],
            ).fetchone()[0]
            if have >= per_day:
                continue
            filled = True
            first = 10_000_000_000 + i * per_day
            for chunk in range(have, per_day, 1_000_000):
                last = min(per_day, chunk + 1_000_000)
                conn.execute(FILL, {"first": first + chunk, "last": first + last - 1, "day": day, "n": per_day})
                print(f"  filled {day:%Y-%m-%d}: {last:,} rows", flush=True)
        if filled:
            # As a history filled over days stands: vacuumed (hint bits and the visibility map set, as
            # autovacuum leaves it) and checkpointed, so that the first round does not pay for the
            # bulk insert (its dirty pages, the first reads that set hint bits).
            conn.execute("VACUUM (ANALYZE) shardq_job_history")
            conn.execute("CHECKPOINT")
        return time.monotonic() - began if filled else 0.0


def drain(url: str, checkout: Path, jobs: int, extra_env: dict[str, str] | None = None) -> dict:
    """One no-op drain of ``jobs`` (bench/history_drain.py) in a fresh process
    of ``checkout`` on ``url``: its JSON line as a dict."""
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(checkout),
        **(extra_env or {}),
    }
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "history_drain.py"), str(jobs)],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def drop_day(url: str) -> dict:
    """Drop the older filled day through the archiver's statements (what
    ``maintain_history`` runs for it: DETACH ... CONCURRENTLY, DROP TABLE),
    each timed; older (empty) partitions are dropped first, untimed."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    os.environ.update(env)
    import django

    django.setup()
    from shardq.db.store import WorkerStore

    store = WorkerStore(application_name="shardq-bench-drop")
    filled = [p for p in store.history_partitions() if p["estimated_rows"] > 1_000_000]
    if not filled:
        return {}
    target = filled[0]
    # Everything older than the target first (empty partitions the drains' archivers made).
    store.maintain_history((datetime.now(UTC) - target["low"]).total_seconds() - 5, 86400, ahead_seconds=0)
    keep = (datetime.now(UTC) - target["high"]).total_seconds() - 5  # its end is 5 s past the cutoff
    store.run("set_lock_timeout", {"ms": "2000"}, fetch="none")
    expired = store.run("history_expired_partitions", {"keep": keep})
    timed = {}
    for name, detach, drop in expired:
        began = time.monotonic()
        store._run_generated("detach", detach)
        detached = time.monotonic()
        store._run_generated("drop", drop)
        timed[name] = {"detach_seconds": detached - began, "drop_seconds": time.monotonic() - detached}
    store.close()
    seconds = sum(t["detach_seconds"] + t["drop_seconds"] for t in timed.values())
    return {
        "partition": target["name"],
        "rows": target["estimated_rows"],
        "statements": timed,
        "seconds": seconds,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/history.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--baseline", type=Path, help="a checkout of the code before history (CPU comparison)")
    p.add_argument("--no-drop", action="store_true", help="skip the timed drop of a day")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="also drain a second database with an empty history each round (the spread of two equal databases)",
    )
    p.add_argument("--server", choices=["own", "shared"], default="own")
    args = p.parse_args()
    server = None
    if args.server == "own":
        from tests.pgserver import PrivatePostgres

        server = PrivatePostgres("history", "postgres", settings={"fsync": "on", "autovacuum": "on"})
        server.init()
        server.start()
        os.environ["DATABASE_URL"] = server.url
        print(f"PostgreSQL of its own: {server.url}", flush=True)
    try:
        run(args)
    finally:
        if server is not None:
            server.destroy()


def run(args: argparse.Namespace) -> None:
    variants = {"none": ensure_database("shardq_hb_none", REPO), "10m": ensure_database("shardq_hb_10m", REPO)}
    checkouts = {"none": REPO, "10m": REPO}
    if args.calibrate:
        variants["none2"] = ensure_database("shardq_hb_none2", REPO)
        checkouts["none2"] = REPO
    if args.baseline:
        variants["base"] = ensure_database("shardq_hb_base", args.baseline.resolve())
        checkouts["base"] = args.baseline.resolve()
    seconds = fill(variants["10m"], args.rows)
    print(f"history of shardq_hb_10m: {args.rows:,} rows ({seconds:.0f} s to fill)", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            result = drain(variants[name], checkouts[name], args.jobs)
            runs[name].append(result)
            print(f"round {round_ + 1} {name:>4}: {json.dumps(result)}", flush=True)
    summary: dict = {}
    for name, results in runs.items():
        keys = {k for r in results for k in r} - {"archived"}
        summary[name] = {k: statistics.median(r[k] for r in results if k in r) for k in sorted(keys)}
    rate_ratios = [t["jobs_per_s"] / n["jobs_per_s"] for t, n in zip(runs["10m"], runs["none"], strict=True)]
    summary["rate_10m_over_none"] = statistics.median(rate_ratios)
    if "none2" in runs:
        equal = [t["jobs_per_s"] / n["jobs_per_s"] for t, n in zip(runs["none2"], runs["none"], strict=True)]
        summary["rate_none2_over_none"] = statistics.median(equal)
        # 10M against both empty databases of its round: what the history costs, beside the noise.
        both = [
            t["jobs_per_s"] * 2 / (a["jobs_per_s"] + b["jobs_per_s"])
            for t, a, b in zip(runs["10m"], runs["none"], runs["none2"], strict=True)
        ]
        summary["rate_10m_over_empty_mean"] = statistics.median(both)
    if "base" in runs:
        cpu = [n["total_cpu_us"] / b["total_cpu_us"] for n, b in zip(runs["none"], runs["base"], strict=True)]
        worker = [n["worker_cpu_us"] / b["worker_cpu_us"] for n, b in zip(runs["none"], runs["base"], strict=True)]
        summary["total_cpu_none_over_base"] = statistics.median(cpu)
        summary["worker_cpu_none_over_base"] = statistics.median(worker)
        cpu10 = [t["total_cpu_us"] / b["total_cpu_us"] for t, b in zip(runs["10m"], runs["base"], strict=True)]
        summary["total_cpu_10m_over_base"] = statistics.median(cpu10)
        # The job's own path (the worker process and its connections but the
        # archiver's), against the baseline's whole worker: the "hot path".
        hot = [
            n["hot_path_cpu_us"] / b["total_cpu_us"]
            for n, b in zip(runs["none"], runs["base"], strict=True)
            if "hot_path_cpu_us" in n
        ]
        if hot:
            summary["hot_path_cpu_none_over_base"] = statistics.median(hot)
    if not args.no_drop:
        summary["drop_day"] = drop_day(variants["10m"])
    print(json.dumps(summary, indent=1))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
