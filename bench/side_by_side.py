"""Side by side with pgqueuer: 10,000 no-op jobs drained by each queue at its
own defaults, with 1 and with 2 worker processes, in interleaved repetitions
(shardq, pgqueuer, shardq, pgqueuer, ...); medians and shardq ÷ pgqueuer.

    make side-by-side            (installs the ``bench`` extra first; not in CI)
    .venv/bin/python bench/side_by_side.py [--jobs 10000] [--rounds 3] [--workers 1,2]

It installs nothing: pgqueuer comes from pyproject's ``bench`` extra, and the
script stops with what to run when it is missing. Each queue drains in a
database of its own on DATABASE_URL's server (``shardq_side`` migrated for
the test settings, whose ``tests.taskapp`` defines ``noop``; ``shardq_side_pgq``
with pgqueuer's schema), filled before the clock starts (shardq: one
INSERT ... SELECT, as ``bench/limit.py fill``; pgqueuer: its own batched
``Queries.enqueue``).

- shardq: ``manage.py shardq_worker --processes N`` with its defaults
  (``--concurrency 4``, the default poll interval), Django's default logging.
- pgqueuer: N processes, each a ``QueueManager`` on one asyncpg connection
  with an ``async def noop(job)`` entrypoint and ``run(mode=drain)``,
  every other argument its default (batch_size 10, no concurrency limit).

Two figures a run: **wall** (process start → every job done, boot
included: what a user waits) and **steady** (first job done → last, from the
queues' own timestamps: shardq's ``finished_at``, pgqueuer's log rows).
Results go to bench/results/side_by_side.json.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import cpu  # noqa: E402

ENTRYPOINT = "noop"
ENQUEUE_BATCH = 1000


def missing_extra() -> str | None:
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError as exc:
        return (
            f"bench/side_by_side.py needs pgqueuer and asyncpg ({exc}): install the bench extra "
            "(`.venv/bin/pip install -e '.[bench]'`, or `make side-by-side`, which does)."
        )
    return None


# -- pgqueuer -----------------------------------------------------------------------


def pgqueuer_worker(url: str) -> None:
    """One pgqueuer worker process at its defaults, drained until empty."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def main() -> None:
        connection = await asyncpg.connect(url)
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job) -> None:  # the no-op job
            return None

        await manager.run(mode=QueueExecutionMode.drain)
        await connection.close()

    asyncio.run(main())


async def _pgqueuer_prepare(url: str, jobs: int) -> None:
    """pgqueuer's schema (installed once), its tables emptied, ``jobs`` queued."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    connection = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(connection))
        if not await queries.schema_is_installed():
            await queries.install()
        await connection.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        for start in range(0, jobs, ENQUEUE_BATCH):
            n = min(ENQUEUE_BATCH, jobs - start)
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        await connection.execute("ANALYZE pgqueuer")
    finally:
        await connection.close()


def pgqueuer_drain(url: str, jobs: int, workers: int, postmaster: int | None = None) -> dict:
    import psycopg

    asyncio.run(_pgqueuer_prepare(url, jobs))
    with psycopg.connect(url, autocommit=True) as conn:
        client0 = cpu.children_cpu()
        server0 = cpu.cluster_cpu(postmaster) if postmaster is not None else None
        started = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--pgqueuer-worker", url],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        try:
            deadline = time.monotonic() + max(300.0, jobs / 20)
            while conn.execute("SELECT EXISTS (SELECT 1 FROM pgqueuer)").fetchone()[0]:
                for proc in procs:
                    if proc.poll() not in (None, 0):
                        raise RuntimeError(f"a pgqueuer worker exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("pgqueuer jobs still queued after the deadline")
                time.sleep(0.02)
            wall = time.perf_counter() - started
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        client = cpu.children_cpu() - client0
        server = cpu.cluster_cpu(postmaster) - server0 if postmaster is not None and server0 is not None else None
        n, first, last = conn.execute(
            "SELECT count(*), extract(epoch FROM min(created))::float8, extract(epoch FROM max(created))::float8"
            " FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone()
    if n != jobs:
        raise RuntimeError(f"pgqueuer logged {n} successful jobs of {jobs}")
    return {
        "jobs": n,
        "wall_s": wall,
        "wall_rate": n / wall,
        "steady_rate": (n - 1) / (last - first),
        "run_cpu_us_per_job": client / n * 1e6,
        "server_cpu_us_per_job": server / n * 1e6 if server is not None else None,
    }


# -- shardq -------------------------------------------------------------------------


def shardq_drain(bench, jobs: int, workers: int) -> dict:
    out = bench.shardq_drain(workers, jobs, name="side")
    if out["jobs"] != jobs:
        raise RuntimeError(f"shardq finished {out['jobs']} jobs of {jobs}")
    return out


# -- the run ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench/side_by_side.py", description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--workers", default="1,2", help="worker process counts, comma-separated (default 1,2)")
    p.add_argument(
        "--server",
        choices=["shared", "own"],
        default="shared",
        help="own: a PostgreSQL cluster of the bench's own (tests/pgserver.py), started by this process and so at "
        "its priority (run the bench under nice -n -10 on a shared machine); shared: DATABASE_URL's (default)",
    )
    p.add_argument(
        "--settings",
        default=None,
        help="the shardq worker's DJANGO_SETTINGS_MODULE (default: bench/e2e.py's; bench.plain_settings: no "
        "limited task, as a project without limits)",
    )
    p.add_argument("--pgqueuer-worker", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pgqueuer_worker:
        pgqueuer_worker(args.pgqueuer_worker)
        return
    if problem := missing_extra():
        sys.exit(problem)
    if args.server == "own":
        from bench.ownserver import own_server, postmaster_pid

        with own_server("side", settings={"autovacuum": "on"}) as server:
            run(args, postmaster=postmaster_pid(server))
        return
    run(args)


def run(args: argparse.Namespace, postmaster: int | None = None) -> None:
    """The interleaved rounds and their summary; ``postmaster``: the pid of
    a server of the bench's own, whose CPU per job is then reported too."""
    if "DATABASE_URL" not in os.environ:
        sys.exit("bench/side_by_side.py needs DATABASE_URL (a PostgreSQL server it may create two databases on).")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e
    from shardq.conf import get_config

    shardq_url = e2e.bench_database("shardq_side")
    pgq_url = e2e.bench_database("shardq_side_pgq")  # migrated too: harmless, and it creates the database
    defaults = get_config()
    bench = e2e.Bench(e2e.Options(shardq_url, jobs=args.jobs, poll_interval=defaults.poll_interval_seconds))
    bench.postmaster = postmaster
    if args.settings:
        start_worker, settings_module = bench.start_worker, args.settings
        bench.start_worker = lambda *a, **k: start_worker(*a, **{**k, "settings": settings_module})
    counts = [int(w) for w in args.workers.split(",") if w.strip()]
    runs: dict[str, dict[str, list[dict]]] = {str(w): {"shardq": [], "pgqueuer": []} for w in counts}
    for round_ in range(args.rounds):
        for w in counts:
            for name in ("shardq", "pgqueuer") if round_ % 2 == 0 else ("pgqueuer", "shardq"):
                if name == "shardq":
                    out = shardq_drain(bench, args.jobs, w)
                else:
                    out = pgqueuer_drain(pgq_url, args.jobs, w, postmaster)
                runs[str(w)][name].append(out)
                server = out["server_cpu_us_per_job"]
                print(
                    f"round {round_ + 1}, {w} worker(s), {name:8s}: wall {out['wall_rate']:7,.0f} jobs/s "
                    f"({out['wall_s']:.2f} s), steady {out['steady_rate']:7,.0f} jobs/s; CPU a job: workers "
                    f"{out['run_cpu_us_per_job']:.0f} µs" + (f", server {server:.0f} µs" if server is not None else ""),
                    flush=True,
                )
    summary: dict[str, dict] = {}
    print(
        f"\n{args.jobs:,} no-op jobs, medians of {args.rounds} interleaved rounds (ratio: median of per-round ratios)"
    )
    for w in counts:
        side = runs[str(w)]
        row: dict[str, float] = {}
        for figure in ("wall_rate", "steady_rate", "run_cpu_us_per_job", "server_cpu_us_per_job"):
            s = [r[figure] for r in side["shardq"]]
            q = [r[figure] for r in side["pgqueuer"]]
            if None in s or None in q:
                continue
            row[f"shardq_{figure}"] = statistics.median(s)
            row[f"pgqueuer_{figure}"] = statistics.median(q)
            row[f"ratio_{figure}"] = statistics.median(a / b for a, b in zip(s, q, strict=True))
        summary[str(w)] = row
        print(
            f"  {w} worker(s): wall shardq {row['shardq_wall_rate']:,.0f} vs pgqueuer {row['pgqueuer_wall_rate']:,.0f} "
            f"jobs/s = {row['ratio_wall_rate']:.2f}x; steady {row['shardq_steady_rate']:,.0f} vs "
            f"{row['pgqueuer_steady_rate']:,.0f} = {row['ratio_steady_rate']:.2f}x"
        )
        print(
            f"    CPU a job, the workers' whole run: shardq {row['shardq_run_cpu_us_per_job']:.0f} vs pgqueuer "
            f"{row['pgqueuer_run_cpu_us_per_job']:.0f} µs = {row['ratio_run_cpu_us_per_job']:.2f}x"
            + (
                f"; the server's: {row['shardq_server_cpu_us_per_job']:.0f} vs "
                f"{row['pgqueuer_server_cpu_us_per_job']:.0f} µs = {row['ratio_server_cpu_us_per_job']:.2f}x"
                if "ratio_server_cpu_us_per_job" in row
                else ""
            )
        )
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    (results / "side_by_side.json").write_text(
        json.dumps({"jobs": args.jobs, "rounds": args.rounds, "load": load, "runs": runs, "summary": summary}, indent=1)
    )
    print(f"  (1-minute load at the end: {load[0]:.1f}; bench/results/side_by_side.json)")


if __name__ == "__main__":
    main()
