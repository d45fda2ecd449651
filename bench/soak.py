"""``make soak``: sustained load through the example project (issue 13).

    .venv/bin/python bench/soak.py [--minutes 15] [--load 0.7] [--no-docs] [--backlog-rows 5000000]

1. **Peak.** gunicorn serves the example project (2 workers), two separate
   ``shardq_worker`` commands drain; ``--clients`` HTTP clients POST
   ``/add/`` (one job each, the task ``add`` on queue ``reports``) as fast as
   they can for ``--peak-seconds``. The peak is the lower of the enqueue and
   the finish rate over that window.
2. **Soak.** ``--minutes`` at ``--load`` × peak, paced (open loop: a client
   sleeps to its schedule, so a slow answer does not lower the offered
   rate), autovacuum at its defaults, ``shardq_prune --older-than 2m`` every
   minute beside it. Every ``--sample-seconds``: jobs finished (the workers'
   counters), pickup latency of the jobs enqueued in the interval before (an
   id range: primary-key walk, no scan), ``pg_stat_user_tables`` (dead tuples,
   updates, HOT updates), the sizes of ``shardq_job`` and its indexes, and
   each worker's RSS.
3. **Backlog of finished rows.** A 20,000-job drain by one worker on an empty
   table, then with ``--backlog-rows`` SUCCESSFUL rows in it (alternated,
   ``--rounds`` each): the ratio of their rates (target ≥ 0.9).

Writes ``bench/results/soak-*.json``, ``docs/soak.png`` and the "Sustained
load" section of ``docs/benchmarks.md`` (unless ``--no-docs``). Not part of
``make test``: the default run takes about 25 minutes.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "soak.png"
SECTION = "## Sustained load (make soak)"


class Cluster:
    """gunicorn + two shardq_worker commands on the soak database."""

    def __init__(self, url: str, port: int, logs: Path):
        self.url, self.port, self.logs = url, port, logs
        self.procs: dict[str, subprocess.Popen] = {}

    def env(self) -> dict:
        env = dict(os.environ)
        env.pop("SHARDQ_EMBEDDED_STARTED_BY", None)
        env.update(DJANGO_SETTINGS_MODULE="example_project.settings", DATABASE_URL=self.url, PYTHONUNBUFFERED="1")
        return env

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.logs / f"soak-{name}.log", "w")  # noqa: SIM115 (the child writes it until stop)
        self.procs[name] = subprocess.Popen(
            args, cwd=REPO, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self) -> None:
        python = sys.executable
        self._start(
            "gunicorn",
            [
                python,
                "-m",
                "gunicorn",
                "example_project.wsgi",
                "--workers",
                "2",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--log-level",
                "warning",
            ],
        )
        for i in (1, 2):
            self._start(f"worker{i}", [python, "manage.py", "shardq_worker", "--concurrency", "4"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/jobs/0/")
                conn.getresponse().read()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"gunicorn did not answer on port {self.port}; see {self.logs}/soak-gunicorn.log")

    def worker_pids(self) -> list[int]:
        return [p.pid for name, p in self.procs.items() if name.startswith("worker")]

    def stop(self) -> None:
        import signal

        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


class Clients:
    """HTTP clients POSTing /add/; ``rate`` None: as fast as they can."""

    def __init__(self, port: int, clients: int, rate: float | None):
        self.port, self.clients, self.rate = port, clients, rate
        self.sent = 0
        self.errors = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(clients)]

    def run(self, index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        interval = self.clients / self.rate if self.rate else 0.0
        next_at = time.monotonic() + index * interval / self.clients
        body = json.dumps({"a": index, "b": 1})
        headers = {"Content-Type": "application/json"}
        while not self.stop.is_set():
            if interval:
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_at += interval
            try:
                conn.request("POST", "/add/", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                ok = response.status == 201
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                ok = False
            with self.lock:
                if ok:
                    self.sent += 1
                else:
                    self.errors += 1

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)


def finished_count(conn) -> int:
    """Jobs finished by the live workers (their counters, written every heartbeat) — no table scan."""
    row = conn.execute(
        "SELECT COALESCE(sum((stats->>'succeeded')::bigint + (stats->>'failed')::bigint), 0) FROM shardq_worker"
    ).fetchone()
    return int(row[0])


def table_stats(conn) -> dict:
    row = conn.execute(
        "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, "
        "pg_relation_size('shardq_job'), pg_indexes_size('shardq_job') "
        "FROM pg_stat_user_tables WHERE relname = 'shardq_job'"
    ).fetchone()
    keys = ("live", "dead", "updates", "hot_updates", "autovacuums", "table_bytes", "index_bytes")
    return dict(zip(keys, row, strict=True))


def pickup(conn, after_id: int, upto_id: int) -> dict:
    """Pickup latency (ms, database clock) of the finished jobs with ids in (after_id, upto_id]."""
    row = conn.execute(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s)"
        " FROM (SELECT 1000 * (extract(epoch FROM last_attempted_at) - extract(epoch FROM run_after)) AS s"
        " FROM shardq_job WHERE id > %s AND id <= %s AND last_attempted_at IS NOT NULL) AS x",
        (after_id, upto_id),
    ).fetchone()
    return {"n": row[0], "p50_ms": row[1], "p99_ms": row[2]}


def rss_mib(pids: list[int]) -> float:
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def measure_peak(url: str, port: int, clients: int, seconds: float) -> dict:
    """Clients as fast as they can for ``seconds``; the enqueue rate over that
    window, and the finish rate from the first request until every job it
    enqueued is done (the workers may lag the clients)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        first_id = conn.execute("SELECT COALESCE(max(id), 0) FROM shardq_job").fetchone()[0]
        load = Clients(port, clients, None)
        started = time.monotonic()
        load.start()
        time.sleep(seconds)
        load.finish()
        elapsed = time.monotonic() - started
        sent = load.sent
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            pending = conn.execute(
                "SELECT count(*) FROM shardq_job WHERE id > %s AND status IN ('READY', 'CLAIMED', 'RUNNING')",
                (first_id,),
            ).fetchone()[0]
            if not pending:
                break
            time.sleep(0.05)
        drained = time.monotonic() - started
    return {"enqueue_rate": sent / elapsed, "finish_rate": sent / drained, "errors": load.errors}


def soak(url: str, port: int, cluster: Cluster, rate: float, minutes: float, sample_seconds: float, clients: int):
    import psycopg

    samples = []
    prune_runs = []
    stop_prune = threading.Event()

    def prune_loop():
        while not stop_prune.wait(60):
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "manage.py", "shardq_prune", "--older-than", "2m", "--no-progress"],
                cwd=REPO,
                env=cluster.env(),
                capture_output=True,
                text=True,
            )
            prune_runs.append(
                {
                    "at": time.time(),
                    "seconds": time.monotonic() - started,
                    "returncode": done.returncode,
                    "output": done.stdout[-400:] + done.stderr[-400:],
                }
            )

    with psycopg.connect(url, autocommit=True) as conn:
        load = Clients(port, clients, rate)
        pruner = threading.Thread(target=prune_loop, daemon=True)
        start = time.monotonic()
        last_id = conn.execute("SELECT COALESCE(max(id), 0) FROM shardq_job").fetchone()[0]
        previous_id = last_id
        last_done = finished_count(conn)
        load.start()
        pruner.start()
        try:
            while time.monotonic() - start < minutes * 60:
                time.sleep(sample_seconds)
                now_id = conn.execute("SELECT COALESCE(max(id), 0) FROM shardq_job").fetchone()[0]
                done = finished_count(conn)
                sample = {
                    "t": time.monotonic() - start,
                    "finished": done - last_done,
                    "sent": load.sent,
                    "errors": load.errors,
                    # The jobs enqueued one interval earlier: by now they have run.
                    "pickup": pickup(conn, previous_id, last_id),
                    "table": table_stats(conn),
                    "rss_mib": rss_mib(cluster.worker_pids()),
                }
                samples.append(sample)
                previous_id, last_id, last_done = last_id, now_id, done
        finally:
            load.finish()
            stop_prune.set()
            pruner.join(timeout=120)
    return {"rate": rate, "samples": samples, "prune_runs": prune_runs}


def finished_backlog(url: str, rows: int) -> None:
    """``rows`` SUCCESSFUL jobs finished a day ago (setup, not measured)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at, started_at, finished_at, last_attempted_at,
                return_value)
            SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 0, t, h & 63, h, NULL, false,
                   'SUCCESSFUL', 3, 1, 1, 1, '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '["w"]'::jsonb, t, t, t, t, 'null'
            FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h,
                         clock_timestamp() - interval '1 day' AS t
                  FROM generate_series(1, %s)) AS g
            """,
            (rows,),
        )
        conn.execute("VACUUM ANALYZE shardq_job")


def backlog_drains(bench_url: str, rows: int, rounds: int, jobs: int) -> dict:
    """One worker's 20k drain on an empty table and beside ``rows`` finished rows, alternated."""
    from bench.e2e import Bench, Options

    bench = Bench(Options(database_url=bench_url, jobs=jobs))
    empty, full = [], []
    try:
        for _ in range(rounds):
            bench.reset()
            empty.append(bench.shardq_drain(1, jobs))
            bench.reset()
            finished_backlog(bench_url, rows)
            # shardq_drain empties the table first: keep the finished rows instead.
            full.append(drain_beside(bench, jobs))
    finally:
        bench.reset()
        bench.conn.close()
    e = statistics.median(r["wall_rate"] for r in empty)
    f = statistics.median(r["wall_rate"] for r in full)
    return {"rows": rows, "empty": empty, "full": full, "ratio": f / e}


def drain_beside(bench, jobs: int) -> dict:
    from bench import limit

    bench.sql("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")
    bench.sql("DELETE FROM shardq_worker")
    limit.fill(bench.url, jobs)
    started = time.perf_counter()
    proc = bench.start_worker(1, name="drain-beside-finished")
    try:
        bench.wait_empty(timeout=600, proc=proc)
        wall = time.perf_counter() - started
    finally:
        bench.stop_worker(proc)
    return {"jobs": jobs, "wall_s": wall, "wall_rate": jobs / wall}


def per_minute(samples: list[dict], sample_seconds: float) -> list[dict]:
    minutes: dict[int, list[dict]] = {}
    for s in samples:
        minutes.setdefault(int((s["t"] - 1e-9) // 60), []).append(s)
    out = []
    for m, group in sorted(minutes.items()):
        p99s = [g["pickup"]["p99_ms"] for g in group if g["pickup"]["p99_ms"] is not None]
        out.append(
            {
                "minute": m + 1,
                "finished_per_s": sum(g["finished"] for g in group) / (len(group) * sample_seconds),
                "pickup_p99_ms": max(p99s) if p99s else None,
                "dead_tuples": group[-1]["table"]["dead"],
                "table_mib": group[-1]["table"]["table_bytes"] / 2**20,
                "index_mib": group[-1]["table"]["index_bytes"] / 2**20,
                "hot_share": (group[-1]["table"]["hot_updates"] / group[-1]["table"]["updates"])
                if group[-1]["table"]["updates"]
                else None,
                "rss_mib": group[-1]["rss_mib"],
            }
        )
    return out


def plot(minutes: list[dict], path: Path, subtitle: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = [m["minute"] for m in minutes]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    axes[0][0].plot(x, [m["finished_per_s"] for m in minutes], marker="o")
    axes[0][0].set_title("finished jobs/s (per minute)")
    axes[0][1].plot(x, [m["pickup_p99_ms"] or 0 for m in minutes], marker="o", color="tab:red")
    axes[0][1].set_title("pickup p99, ms")
    axes[1][0].plot(x, [m["table_mib"] for m in minutes], label="shardq_job heap MiB")
    axes[1][0].plot(x, [m["index_mib"] for m in minutes], label="its indexes MiB")
    ax2 = axes[1][0].twinx()
    ax2.plot(x, [m["dead_tuples"] for m in minutes], color="tab:gray", linestyle="--", label="dead tuples")
    axes[1][0].legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    axes[1][0].set_title("table, indexes (MiB) and dead tuples")
    axes[1][1].plot(x, [m["rss_mib"] for m in minutes], marker="o", color="tab:green")
    axes[1][1].set_title("RSS of the 2 workers, MiB")
    for row in axes:
        for ax in row:
            ax.set_xlabel("minute")
            ax.grid(alpha=0.3)
    fig.suptitle(f"make soak — {subtitle}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def summary(result: dict) -> dict:
    minutes = result["minutes"]
    n = len(minutes)
    window = min(5, n // 2) or 1
    first = statistics.mean(m["finished_per_s"] for m in minutes[:window])
    last = statistics.mean(m["finished_per_s"] for m in minutes[-window:])
    rss_after_first = [m["rss_mib"] for m in minutes[1:]] or [minutes[0]["rss_mib"]]
    prune = result["soak"]["prune_runs"]
    return {
        "offered_rate": result["soak"]["rate"],
        "throughput_first_window": first,
        "throughput_last_window": last,
        "drift": last / first - 1 if first else None,
        "window_minutes": window,
        "pickup_p99_ms_worst_minute": max((m["pickup_p99_ms"] or 0) for m in minutes),
        "rss_growth_after_minute_1_mib": max(rss_after_first) - rss_after_first[0],
        "hot_share_end": minutes[-1]["hot_share"],
        "prune_seconds_max": max((p["seconds"] for p in prune), default=None),
        "prune_failures": sum(1 for p in prune if p["returncode"]),
        "backlog_ratio": result.get("backlog", {}).get("ratio"),
    }


def section(result: dict, s: dict, plotted: bool) -> str:
    minutes = result["minutes"]
    lines = [
        SECTION,
        "",
        f"Written by `make soak` (`bench/soak.py`) on {result['when']}: {result['machine']}. gunicorn (2 workers) serves "
        "the example project; `--clients` HTTP clients POST `/add/` (one job each) on a fixed schedule at "
        f"{s['offered_rate']:,.0f} jobs/s, {result['options']['load']:.0%} of the peak measured first "
        f"({result['peak']['enqueue_rate']:,.0f} enqueued/s, {result['peak']['finish_rate']:,.0f} finished/s, the lower "
        "taken); two separate `shardq_worker --concurrency 4` commands drain; autovacuum at its defaults; "
        "`shardq_prune --older-than 2m` runs every minute beside it. This run: "
        f"`--minutes {result['options']['minutes']:g} --backlog-rows {result['options']['backlog_rows']} "
        f"--rounds {result['options']['rounds']}` (`make soak`: 15 minutes, 5,000,000 rows, 3 rounds).",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| throughput, first {s['window_minutes']} min → last {s['window_minutes']} min | "
        f"{s['throughput_first_window']:,.0f} → {s['throughput_last_window']:,.0f} jobs/s "
        f"({s['drift']:+.1%}) | within ±10 % |",
        f"| worst minute's pickup p99 | {s['pickup_p99_ms_worst_minute']:,.1f} ms | report |",
        f"| worker RSS growth after minute 1 (2 workers) | {s['rss_growth_after_minute_1_mib']:+.1f} MiB | none |",
        f"| HOT share of updates at the end | {s['hot_share_end']:.1%} | report |"
        if s["hot_share_end"] is not None
        else "| HOT share | — | report |",
        f"| slowest `shardq_prune` run (every minute) | {s['prune_seconds_max']:.1f} s, {s['prune_failures']} failed | "
        "< 60 s: keeps up |"
        if s["prune_seconds_max"] is not None
        else "| `shardq_prune` | not run | |",
    ]
    if s["backlog_ratio"] is not None:
        b = result["backlog"]
        lines.append(
            f"| 20k drain beside {b['rows']:,} finished rows ÷ on an empty table | {s['backlog_ratio']:.2f}× "
            f"({statistics.median(r['wall_rate'] for r in b['full']):,.0f} vs "
            f"{statistics.median(r['wall_rate'] for r in b['empty']):,.0f} jobs/s) | ≥ 0.9× |"
        )
    lines += [
        "",
        "| minute | finished/s | pickup p99 ms | dead tuples | heap MiB | index MiB | HOT share | RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in minutes:
        hot = f"{m['hot_share']:.1%}" if m["hot_share"] is not None else "—"
        p99 = f"{m['pickup_p99_ms']:,.1f}" if m["pickup_p99_ms"] is not None else "—"
        lines.append(
            f"| {m['minute']} | {m['finished_per_s']:,.0f} | {p99} | {m['dead_tuples']:,} | "
            f"{m['table_mib']:,.1f} | {m['index_mib']:,.1f} | {hot} | {m['rss_mib']:,.0f} |"
        )
    if plotted:
        lines += ["", f"![make soak]({PLOT.name})"]
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    current = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    if SECTION in current:
        head, _, rest = current.partition(SECTION)
        following = rest.find("\n## ")
        current = head + text + (rest[following + 1 :] if following >= 0 else "")
    else:
        current = current.rstrip("\n") + "\n\n" + text
    DOCS.write_text(current)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--load", type=float, default=0.7, help="Share of the measured peak to offer. Default 0.7.")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--peak-seconds", type=float, default=30.0)
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--backlog-rows", type=int, default=5_000_000, help="0 skips the finished-rows drain.")
    p.add_argument("--rounds", type=int, default=3, help="Alternated rounds of the finished-rows drain.")
    p.add_argument("--database", default="shardq_soak")
    p.add_argument(
        "--server",
        choices=("own", "shared"),
        default="own",
        help="own (default): a PostgreSQL of its own (initdb on a free port, every setting at its "
        "default, autovacuum included); shared: DATABASE_URL's server.",
    )
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args(argv)
    if not 0 < args.load <= 1 or args.minutes <= 0 or args.clients < 1:
        sys.exit("--load must be in (0, 1], --minutes > 0, --clients >= 1")

    # SIGTERM (a terminal's kill, a CI timeout) as Ctrl-C: the finally blocks
    # below stop gunicorn, the workers and the soak's own server.
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench.e2e import bench_database, migrate

    server = None
    if args.server == "own":
        from tests.pgserver import PrivatePostgres

        # Defaults throughout (fsync and autovacuum on): what a new server runs.
        server = PrivatePostgres("soak", args.database, settings={"fsync": "on", "max_connections": "200"})
        server.init()
        server.start()
        server.createdb()
        server.createdb(args.database + "_backlog")
        url = server.url
        migrate(url)
    else:
        url = bench_database(args.database)
    try:
        run_soak(args, url, server)
    finally:
        if server is not None:
            server.destroy()


def run_soak(args, url: str, server) -> None:
    from bench.e2e import bench_database, machine, migrate

    # The example project's own tables (its demo app) on the same database.
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings", "DATABASE_URL": url},
        check=True,
    )
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shardq_job, shardq_shard_event")
        conn.execute("DELETE FROM shardq_worker")
        conn.execute("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")
    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = RESULTS / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    info = machine(url)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    result: dict = {"when": when, "options": vars(args)}
    with psycopg.connect(url, autocommit=True) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
    result["machine"] = (
        f"{info['cpus']} CPUs, PostgreSQL {info['postgresql'].split()[0]} "
        f"({'its own server' if server is not None else 'the shared server'}, autovacuum {autovacuum}), "
        f"Python {info['python']}, load average {info['load_average_at_start']} at start"
    )
    cluster = Cluster(url, args.port, logs)
    cluster.start()
    try:
        print(f"peak: {args.clients} clients, {args.peak_seconds:.0f} s ...", flush=True)
        result["peak"] = peak = measure_peak(url, args.port, args.clients, args.peak_seconds)
        rate = args.load * min(peak["enqueue_rate"], peak["finish_rate"])
        print(f"peak {peak}; soak at {rate:,.0f} jobs/s for {args.minutes:g} min ...", flush=True)
        result["soak"] = soak(url, args.port, cluster, rate, args.minutes, args.sample_seconds, args.clients)
    finally:
        cluster.stop()
    result["minutes"] = per_minute(result["soak"]["samples"], args.sample_seconds)
    if args.backlog_rows:
        print(f"drain beside {args.backlog_rows:,} finished rows ...", flush=True)
        if server is not None:
            backlog_url = server.url.rsplit("/", 1)[0] + "/" + args.database + "_backlog"
            migrate(backlog_url)
        else:
            backlog_url = bench_database(args.database + "_backlog")
        result["backlog"] = backlog_drains(backlog_url, args.backlog_rows, args.rounds, 20_000)
    s = result["summary"] = summary(result)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"soak-{stamp}.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(s, indent=2))
    if not args.no_docs:
        plotted = plot(result["minutes"], PLOT, result["machine"])
        write_section(section(result, s, plotted))
        print(f"wrote {DOCS.relative_to(REPO)} and {PLOT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
