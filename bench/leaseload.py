"""Lease-table load per worker, measured (issue 17, part 6): the statements
an idle worker sends per heartbeat, and what the heartbeat statement costs as
the live worker count grows; docs/scaling.md extrapolates them to 1,000
workers.

    .venv/bin/python bench/leaseload.py [--workers 2,4,8] [--seconds 20] [--heartbeat 0.5]

Runs its own PostgreSQL 15 (initdb/pg_ctl as the ``postgres`` system user on a
free port, ``shared_preload_libraries = pg_stat_statements``; the shared
server is never touched), migrates the test settings' schema into it, then
for each worker count N starts N real ``manage.py shardq_worker
--concurrency 1`` processes (64 shards, ``HEARTBEAT`` short so a window holds
many rounds, ``LEASE_TTL`` = 6 heartbeats), waits until every shard is held
and the shares have not changed for three heartbeats, and reads
``pg_stat_statements`` before and after a window of ``--seconds``. Each
statement is named by matching its normalized text against
``shardq/db/sql/``; "per heartbeat" divides by the calls of the
``heartbeat`` statement (one per lease round of each worker).

Then, with no worker running, it times the ``heartbeat`` and
``renew_leases`` statements on one connection (prepared, as the worker runs
them) with 10, 100 and 1,000 live rows in ``shardq_worker``: the heartbeat
returns every live worker of the pool, so its cost is the one term that grows
with the worker count.
"""

import argparse
import contextlib
import difflib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from shardq.db.queries import QUERIES  # noqa: E402
from tests.pgserver import PrivatePostgres  # noqa: E402

SHARDS = 64
#: The statements of the lease protocol (the rest are the fetcher's and the
#: worker's own).
LEASE_STATEMENTS = ("heartbeat", "renew_leases", "rescue_jobs", "claim_shards", "release_shards", "log_shard_claims")


# -- naming pg_stat_statements' texts -------------------------------------------

_COMMENT = re.compile(r"--[^\n]*")
_LITERAL = re.compile(r"(?:\b[Ee])?'(?:[^']|'')*'|%\(\w+\)s|\$\d+|\b\d+(?:\.\d+)?\b")


def normalize(text: str) -> str:
    text = _COMMENT.sub(" ", text.replace("%%", "%"))
    return " ".join(_LITERAL.sub("?", text).split()).lower()


NAMES = {normalize(text): name for name, text in QUERIES.items()}


def name_of(query: str) -> str:
    """The block name (shardq/db/sql) of a statement: its normalized text, else the
    block nearest to it (difflib ratio at least 0.9) (the server also turns some
    keywords into constants, such as ``extract(epoch ...)``'s field)."""
    text = normalize(query)
    if text in NAMES:
        return NAMES[text]

    best = max(NAMES, key=lambda other: difflib.SequenceMatcher(None, text, other).ratio())
    if difflib.SequenceMatcher(None, text, best).ratio() >= 0.9:
        return NAMES[best]
    return "other: " + " ".join(query.split())[:60]


def statement_stats(conn: psycopg.Connection) -> dict[str, dict[str, float]]:
    rows = conn.execute(
        "SELECT query, calls, rows, total_exec_time, wal_records, wal_bytes, shared_blks_hit + shared_blks_read "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    out: dict[str, dict[str, float]] = {}
    for query, calls, nrows, ms, wal_records, wal_bytes, blocks in rows:
        entry = out.setdefault(
            name_of(query), {"calls": 0, "rows": 0, "ms": 0.0, "wal_records": 0, "wal_bytes": 0, "blocks": 0}
        )
        entry["calls"] += calls
        entry["rows"] += nrows
        entry["ms"] += ms
        entry["wal_records"] += wal_records
        entry["wal_bytes"] += int(wal_bytes)
        entry["blocks"] += blocks
    return out


def delta(after: dict, before: dict) -> dict:
    return {
        name: {k: v - before.get(name, {}).get(k, 0) for k, v in stats.items()}
        for name, stats in after.items()
        if stats["calls"] - before.get(name, {}).get("calls", 0) > 0
    }


# -- one worker count -------------------------------------------------------------


def settled(conn: psycopg.Connection, workers: int) -> tuple[int, ...] | None:
    """The live owners' shard counts when all 64 shards are held by live
    workers and there are ``workers`` of them; None otherwise."""
    rows = conn.execute(
        "SELECT s.owner, count(*) FROM shardq_shard s JOIN shardq_worker w ON w.id::text = s.owner::text "
        "WHERE s.pool = '*' AND w.state = 'RUNNING' AND s.lease_expires > clock_timestamp() GROUP BY s.owner"
    ).fetchall()
    counts = tuple(sorted(c for _, c in rows))
    if len(counts) == workers and sum(counts) == SHARDS:
        return counts
    return None


def measure(url: str, workers: int, seconds: float, heartbeat: float) -> dict:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=url,
        SHARDQ_HEARTBEAT=str(heartbeat),
        SHARDQ_LEASE_TTL=str(heartbeat * 6),
        SHARDQ_SHARD_COUNT=str(SHARDS),
        PYTHONUNBUFFERED="1",
    )
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(workers)]
        return _measure(url, workers, seconds, heartbeat, env, logs)


def _measure(url: str, workers: int, seconds: float, heartbeat: float, env: dict, logs: list) -> dict:
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shardq_worker", "--concurrency", "1"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for log in logs
    ]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            stable_since, last = time.monotonic(), None
            while time.monotonic() < deadline:
                now = settled(conn, workers)
                if now is None or now != last:
                    stable_since, last = time.monotonic(), now
                elif time.monotonic() - stable_since >= 3 * heartbeat:
                    break
                time.sleep(heartbeat / 4)
            else:
                for log in logs:
                    log.seek(0)
                    sys.stderr.write(log.read().decode(errors="replace")[-2000:])
                raise RuntimeError(f"{workers} workers did not settle within 120 s")
            before = statement_stats(conn)
            started = time.monotonic()
            time.sleep(seconds)
            after = statement_stats(conn)
            window = time.monotonic() - started
            shares = settled(conn, workers)
            connections = dict(
                conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1 ORDER BY 1"
                ).fetchall()
            )
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    used = delta(after, before)
    rounds = used.get("heartbeat", {}).get("calls", 0)
    return {
        "workers": workers,
        "window_seconds": window,
        "heartbeat_seconds": heartbeat,
        "lease_rounds": rounds,
        "rounds_per_worker_per_second": rounds / workers / window,
        "shares_at_end": shares,
        "connections": connections,
        "statements": used,
        "per_round": {name: {k: v / rounds for k, v in stats.items()} for name, stats in used.items() if rounds},
    }


# -- the heartbeat's cost as the live rows grow ----------------------------------


def time_statements(url: str, live_counts: list[int], repeats: int = 300) -> list[dict]:
    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        for live in live_counts:
            conn.execute("DELETE FROM shardq_worker")
            conn.execute(
                "INSERT INTO shardq_worker (id, host, pid, queues, pool, started_at, heartbeat_at, state, stats, name) "
                "SELECT gen_random_uuid(), 'host', g, '[]', '*', clock_timestamp(), clock_timestamp(), 'RUNNING', "
                "'{}', '' FROM generate_series(1, %s) g",
                [live],
            )
            me = conn.execute("SELECT id FROM shardq_worker LIMIT 1").fetchone()[0]
            conn.execute("UPDATE shardq_shard SET owner = %s, claim_version = 1, lease_expires = clock_timestamp() "
                         "+ interval '1 hour' WHERE pool = '*' AND shard = 0", [str(me)])  # fmt: skip
            conn.execute("ANALYZE shardq_worker")
            stats = json.dumps({"claimed": 1, "finished": 1})
            timings: dict[str, list[float]] = {"heartbeat": [], "renew_leases": []}
            for _ in range(repeats):
                t = time.perf_counter()
                rows = conn.execute(
                    QUERIES["heartbeat"],
                    {"worker": str(me), "stats": stats, "ttl": 3600.0, "pool": "*", "now": None},
                    prepare=True,
                ).fetchall()
                timings["heartbeat"].append(time.perf_counter() - t)
                t = time.perf_counter()
                conn.execute(
                    QUERIES["renew_leases"],
                    {"worker": str(me), "ttl": 3600.0, "shards": [0], "versions": [1], "pool": "*", "now": None},
                    prepare=True,
                ).fetchall()
                timings["renew_leases"].append(time.perf_counter() - t)
            assert len(rows) == live
            out.append({"live": live, **{k: statistics.median(v) * 1000 for k, v in timings.items()}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,4,8", help="worker counts, comma-separated (default 2,4,8)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window per count (default 20)")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="HEARTBEAT in seconds (default 0.5)")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    if not counts or min(counts) < 1 or max(counts) > SHARDS:
        parser.error(f"--workers: counts between 1 and {SHARDS}")
    server = PrivatePostgres(
        "leaseload",
        "shardq_leaseload",
        settings={"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"},
    )
    try:
        server.init()
        server.start()
        server.createdb()
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            cwd=ROOT,
            env=dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=server.url),
            check=True,
        )
        runs = []
        for n in counts:
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute("UPDATE shardq_worker SET state = 'STOPPED' WHERE state = 'RUNNING'")
            runs.append(measure(server.url, n, args.seconds, args.heartbeat))
        costs = time_statements(server.url, [10, 100, 1000])
    finally:
        server.destroy()
    print(f"load average {os.getloadavg()[0]:.1f}; HEARTBEAT {args.heartbeat}s, LEASE_TTL {args.heartbeat * 6}s")
    names = sorted({name for run in runs for name in run["per_round"]})
    print("| statement | " + " | ".join(f"{run['workers']} workers" for run in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for name in names:
        cells = [f"{run['per_round'].get(name, {}).get('calls', 0):.3f}" for run in runs]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for run in runs:
        lease = {k: v for k, v in run["per_round"].items() if k in LEASE_STATEMENTS}
        print(
            f"{run['workers']} workers: {run['lease_rounds']} rounds in {run['window_seconds']:.1f}s "
            f"({run['rounds_per_worker_per_second']:.2f}/worker/s), shares {run['shares_at_end']}; per round: "
            f"lease statements {sum(s['calls'] for s in lease.values()):.3f}, "
            f"rows {sum(s['rows'] for s in lease.values()):.1f}, "
            f"WAL {sum(s['wal_bytes'] for s in lease.values()):.0f} B in "
            f"{sum(s['wal_records'] for s in lease.values()):.1f} records, "
            f"exec {sum(s['ms'] for s in lease.values()):.3f} ms; "
            f"all statements {sum(s['calls'] for s in run['per_round'].values()):.3f}; "
            f"connections {run['connections']}"
        )
    for cost in costs:
        print(
            f"{cost['live']} live workers: heartbeat {cost['heartbeat']:.3f} ms, "
            f"renew_leases {cost['renew_leases']:.3f} ms (client round trip, median)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "costs": costs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
