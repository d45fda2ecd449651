"""Workflow figures (issue 16), on the bench database:

1. enqueue: a 10,000-job graph (1 -> 9,998 -> 1) with ``Workflow.enqueue``
   against ``shardq.enqueue_many`` of the same count (no-op jobs, one
   transaction each), alternated, ``--rounds`` times;
2. drain: ``--jobs`` READY no-op jobs drained by one ``shardq_worker``
   (``--processes 1 --concurrency 4``, as ``make bench``'s drain) beside
   ``--waiting`` WAITING rows, against none and against as many SUCCESSFUL
   rows (a table as big, no WAITING row), rotated.

    DATABASE_URL=... .venv/bin/python bench/workflows.py [--rounds 3] [--waiting 1000000] [--jobs 20000]

Prints each round, the medians and the ratios, and the load average. The
fan-out/fan-in over 3 real workers and the finish -> start latency are
tests (``make workflows`` runs them at full size).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/workflows.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--waiting", type=int, default=1_000_000)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--graph", type=int, default=10_000)
    p.add_argument("--database", default="shardq_bench")
    p.add_argument("--only", default="enqueue,drain")
    args = p.parse_args()
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from bench import e2e

    url = e2e.bench_database(args.database)
    if connection.settings_dict["NAME"] != args.database:
        # The in-process enqueue runs on Django's connection: again, on the bench database.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "DATABASE_URL": url})
    phases = set(args.only.split(","))
    bench = WaitingBench(e2e.Options(database_url=url, jobs=args.jobs))
    try:
        if "enqueue" in phases:
            enqueue(bench, args)
        if "drain" in phases:
            drain(bench, args)
    finally:
        bench.waiting = 0
        bench.reset()
        bench.conn.close()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


def enqueue(bench, args) -> None:
    from django.db import transaction

    import shardq
    from shardq import Workflow
    from tests.taskapp.tasks import noop

    n = args.graph

    def graph() -> float:
        bench.reset()
        started = time.perf_counter()
        with transaction.atomic():
            wf = Workflow(name="bench")
            root = wf.add(noop)
            middle = [wf.add(noop, after=[root]) for _ in range(n - 2)]
            wf.add(noop, after=middle)
            wf.enqueue()
        return n / (time.perf_counter() - started)

    def plain() -> float:
        bench.reset()
        started = time.perf_counter()
        with transaction.atomic():
            shardq.enqueue_many(noop, [((), {})] * n)
        return n / (time.perf_counter() - started)

    rates: dict[str, list[float]] = {"graph": [], "plain": []}
    for round_ in range(args.rounds):
        order = [("graph", graph), ("plain", plain)]
        if round_ % 2:
            order.reverse()
        for label, run in order:
            rates[label].append(run())
            print(f"enqueue round {round_ + 1} {label:6} {rates[label][-1]:10,.0f} jobs/s", flush=True)
    ratios = [g / p for g, p in zip(rates["graph"], rates["plain"], strict=True)]
    print(
        f"enqueue of {n} jobs: graph (1 -> {n - 2} -> 1, {2 * (n - 2)} edges) median "
        f"{statistics.median(rates['graph']):,.0f} jobs/s, enqueue_many median {statistics.median(rates['plain']):,.0f} "
        f"jobs/s; ratio per round median {statistics.median(ratios):.2f}"
    )


def drain(bench, args) -> None:
    # "finished": as many SUCCESSFUL rows instead, to tell the cost of a
    # bigger table (a deeper primary key) from the cost of WAITING rows.
    runs: dict[str, list[dict]] = {"none": [], "waiting": [], "finished": []}
    arms = [("none", 0, "WAITING"), ("waiting", args.waiting, "WAITING"), ("finished", args.waiting, "SUCCESSFUL")]
    for round_ in range(args.rounds):
        order = arms[round_ % 3 :] + arms[: round_ % 3]
        if round_ % 2:
            order.reverse()
        for label, waiting, status in order:
            bench.waiting, bench.status = waiting, status
            result = bench.shardq_drain(1, args.jobs, name=f"wf-{label}")
            runs[label].append(result)
            print(
                f"drain round {round_ + 1} {label:8} wall {result['wall_rate']:8,.0f} jobs/s"
                f"  steady {result['steady_rate'] or 0:8,.0f} jobs/s"
                f"  worker CPU {result['cpu_us_per_job'] or 0:6,.0f} µs/job",
                flush=True,
            )
    for label, results in runs.items():
        cpu = [r["cpu_us_per_job"] for r in results if r["cpu_us_per_job"]]
        if cpu:
            print(f"worker CPU per job beside {label}: median {statistics.median(cpu):,.0f} µs")
    for key in ("wall_rate", "steady_rate"):
        for other in ("none", "finished"):
            ratios = [w[key] / n[key] for w, n in zip(runs["waiting"], runs[other], strict=True)]
            print(
                f"drain of {args.jobs} beside {args.waiting:,} WAITING rows / {other}, {key}: "
                f"median {statistics.median(r[key] for r in runs['waiting']):,.0f} / "
                f"{statistics.median(r[key] for r in runs[other]):,.0f} jobs/s; per-round ratios "
                f"{', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.3f}"
            )


def _bench_class():
    from bench import e2e

    class Waiting(e2e.Bench):
        """Bench whose reset leaves ``waiting`` WAITING rows (children of a
        parent that never finishes), analyzed, beside what the drain fills."""

        waiting = 0
        status = "WAITING"

        def reset(self) -> None:
            self.sql("TRUNCATE shardq_job, shardq_shard_event, shardq_edge")
            self.sql("DELETE FROM shardq_worker")
            self.sql("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")
            if self.waiting:
                self.sql(
                    """
                    INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                        key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                        args, kwargs, errors, worker_ids, enqueued_at, waiting_on)
                    SELECT 'bench.filler', 'default', 'default', 0, t, h & 63, h, NULL, false,
                           %s, 0, 0, 0, 1, '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, t, 1
                    FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, clock_timestamp() AS t
                          FROM generate_series(1, %s)) AS g
                    """,
                    [self.status, self.waiting],
                )
                self.sql("ANALYZE shardq_job")
                # Rows that have been there a while: their pages written out,
                # not flushed by the checkpointer during the drain that follows.
                self.sql("CHECKPOINT")

        def finished(self):
            """As e2e.Bench.finished, over the drained jobs only (not the filler rows)."""
            n, first, last = self.sql(
                "SELECT count(*), extract(epoch FROM min(finished_at))::float8,"
                " extract(epoch FROM max(finished_at))::float8"
                " FROM shardq_job WHERE status = 'SUCCESSFUL' AND task_path <> 'bench.filler'"
            )[0]
            span = last - first if n > 1 else None
            return n, ((n - 1) / span if span else None), first, last

    return Waiting


def WaitingBench(options):  # a class built once Django is set up
    return _bench_class()(options)


if __name__ == "__main__":
    main()
