"""``make bench``: shardq against the physical limit (see bench/e2e.py).

    .venv/bin/python bench/run.py [--rounds N] [--full] [--only drain,latency] [--no-docs]

Runs from the checkout with the test settings (``tests.settings``, whose
``tests.taskapp`` defines the ``noop`` task every job names); its worker and
enqueue child processes use them too. Not part of the shardq package.
"""

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHASES = ("enqueue", "drain", "latency", "rss", "backlog", "priority", "fairshare", "limits")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/run.py",
        description="Benchmark shardq against a bare psycopg loop (enqueue, drain, pickup latency, memory, "
        "claim cost vs backlog, priority pickup and order, fair share of workers started together or joining, the cost of concurrency limits); prints its tables, writes bench/results/ and docs/benchmarks.md.",
    )
    p.add_argument(
        "--rounds",
        "--reps",
        "--repeat",
        dest="rounds",
        default="3",
        help="Alternated rounds (limit, shardq, limit, ...) of every compared figure: enqueue and drains; "
        "medians shown. Default 3. (--reps and --repeat are older names.)",
    )
    p.add_argument("--full", action="store_true", help="Claim cost at 1,000,000 READY rows (default 200,000).")
    p.add_argument("--jobs", default="20000", help="Jobs per drain run. Default 20000.")
    p.add_argument("--latency-seconds", default="10", help="Length of each pickup-latency run. Default 10.")
    p.add_argument("--concurrency", default="4", help="shardq_worker --concurrency. Default 4.")
    p.add_argument(
        "--only",
        default="",
        help=f"Comma-separated phases to run: {', '.join(PHASES)} (a partial run does not update docs/benchmarks.md).",
    )
    p.add_argument(
        "--database",
        default="shardq_bench",
        help="Name of the bench's own database on DATABASE_URL's server (created and "
        "migrated; its shardq tables are emptied). Default shardq_bench.",
    )
    p.add_argument("--no-docs", action="store_true", help="Do not rewrite docs/benchmarks.md and the plot.")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    phases = tuple(p.strip() for p in args.only.split(",") if p.strip()) or PHASES
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        sys.exit(f"--only names unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}.")
    try:
        latency_seconds = float(args.latency_seconds)
    except ValueError:
        latency_seconds = 0.0
    if latency_seconds <= 0:
        sys.exit(f"--latency-seconds must be a number > 0, not {args.latency_seconds!r}.")

    # `python bench/run.py` puts bench/ first on sys.path; the checkout is
    # what the imports need (`bench.e2e`, `tests.settings`).
    sys.path[:] = [str(REPO), *(p for p in sys.path if Path(p or ".").resolve() != REPO / "bench")]
    from django.core.management.base import CommandError

    from shardq.management.flags import whole_number as count

    try:
        sizes = {
            "jobs": count("jobs", args.jobs, 100),
            "rounds": count("rounds", args.rounds),
            "concurrency": count("concurrency", args.concurrency),
        }
    except CommandError as exc:
        sys.exit(str(exc))

    os.chdir(REPO)  # children run `manage.py` and bench/ scripts from the checkout
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    try:
        url = e2e.bench_database(args.database)
    except RuntimeError as exc:
        sys.exit(str(exc))
    options = e2e.Options(
        database_url=url,
        backlog=1_000_000 if args.full else 200_000,
        latency_seconds=latency_seconds,
        phases=phases,
        write_docs=not args.no_docs,
        **sizes,
    )
    e2e.run(options)


if __name__ == "__main__":
    main()
