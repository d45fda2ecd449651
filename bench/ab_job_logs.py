"""A/B of per-job logs (issue 27 §5): ``make bench``'s no-op drain with the
feature on and off, in one run, alternating, so both see the same load.

    DATABASE_URL=... .venv/bin/python bench/ab_job_logs.py [--rounds 8] [--jobs 20000]

Each round drains ``--jobs`` READY no-op jobs (tasks that log nothing) with
one ``shardq_worker --processes 1 --concurrency 4`` under Django's default
LOGGING (``tests.isolation.default_logging_settings``: the root logger at
WARNING, so the worker lowers it to INFO and installs its handler), and with
``SHARDQ["JOB_LOG_BYTES"] = 0`` (``tests.isolation.no_job_logs_settings``:
nothing installed, no attempt scoped); which goes first alternates. Prints
each round and the medians of on ÷ off per round (wall, steady, and the
worker's CPU per job), as ``bench/ab_drain.py`` does for two checkouts (use
that one against a checkout from before the feature for the schema's and
the SQL's share too).
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {"on": "tests.isolation.default_logging_settings", "off": "tests.isolation.no_job_logs_settings"}


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/ab_job_logs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--database", default="shardq_bench")
    p.add_argument(
        "--micro",
        action="store_true",
        help="only time, in-process, what the feature adds to one attempt that logs nothing (best of 5)",
    )
    args = p.parse_args()
    if args.micro:
        micro()
        return
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    bench = e2e.Bench(e2e.Options(database_url=e2e.bench_database(args.database), jobs=args.jobs))
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    try:
        for round_ in range(args.rounds):
            order = ["off", "on"] if round_ % 2 else ["on", "off"]
            for label in order:
                result = bench.shardq_drain(1, args.jobs, name=f"joblogs-{label}", settings=SETTINGS[label])
                runs[label].append(result)
                print(
                    f"round {round_ + 1} {label:3} wall {result['wall_rate']:8,.0f} jobs/s"
                    f"  steady {result['steady_rate'] or 0:8,.0f} jobs/s"
                    f"  cpu {result.get('cpu_us_per_job') or 0:6.1f} µs/job  load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        bench.reset()
        bench.conn.close()
    for what in ("wall_rate", "steady_rate", "cpu_us_per_job"):
        ratios = [a[what] / b[what] for a, b in zip(runs["on"], runs["off"], strict=True) if a[what] and b[what]]
        print(
            f"{what}: on ÷ off median of rounds {statistics.median(ratios):.3f}"
            f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); medians: off"
            f" {statistics.median(r[what] for r in runs['off']):,.1f}, on"
            f" {statistics.median(r[what] for r in runs['on']):,.1f}"
            f" {'µs/job (worker CPU, steady state)' if what == 'cpu_us_per_job' else 'jobs/s'}"
        )


def micro(number: int = 200_000) -> None:
    """What ``Executor.execute`` does for per-job logs around a task that logs
    nothing (the scope's attempt set and cleared, ``end_attempt``, the test
    of the log), against the same call without it; best of 5."""
    import timeit

    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS["on"])
    import django

    django.setup()
    from shardq.tasks import ShardTask
    from shardq.worker.joblogs import CURRENT, end_attempt, thread_scope
    from shardq.worker.jobs import ClaimedJob
    from tests.taskapp.tasks import noop

    job = ClaimedJob.__new__(ClaimedJob)

    def call() -> None:
        noop.func()

    def call_with_logs() -> None:
        job.attempt_log = None  # a fresh claim's
        log = None
        if noop.log if isinstance(noop, ShardTask) else True:
            scope = CURRENT.get() or thread_scope()
            scope.attempt = (job, noop, 65536)
            try:
                noop.func()
            finally:
                scope.attempt = None
                log = end_attempt(job)
        if log is not None:
            raise AssertionError("nothing was logged")

    def plain() -> None:
        job.attempt_log = None
        call()

    best = {}
    for name, fn in (("without", plain), ("with", call_with_logs)):
        best[name] = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
    print(
        f"one attempt that logs nothing: {best['without']:.3f} µs without per-job logs, {best['with']:.3f} µs "
        f"with: {best['with'] - best['without']:.3f} µs added (best of 5 × {number:,}; load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
