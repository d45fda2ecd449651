"""``manage.py shardq_bench``: shardq against the physical limit (see bench/e2e.py).

Needs the repository checkout (the ``bench/`` and ``tests/`` packages): the
benchmark's worker and enqueue processes run with ``tests.settings``, whose
``tests.taskapp`` defines the ``noop`` task every job names.
"""

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from shardq.management.flags import whole_number as count

REPO = Path(__file__).resolve().parents[3]
PHASES = ("enqueue", "drain", "latency", "rss", "backlog")


class Command(BaseCommand):
    help = ("Benchmark shardq against a bare psycopg loop (enqueue, drain, pickup latency, memory, "
            "claim cost vs backlog); prints one table, writes bench/results/ and docs/benchmarks.md.")

    def add_arguments(self, parser):
        parser.add_argument("--repeat", default="1", help="Runs of each shardq drain (median shown). Default 1.")
        parser.add_argument("--reps", default="3", help="Runs of each cheap figure: enqueue, limit drains. Default 3.")
        parser.add_argument("--full", action="store_true", help="Claim cost at 1,000,000 READY rows (default 200,000).")
        parser.add_argument("--jobs", default="20000", help="Jobs per drain run. Default 20000.")
        parser.add_argument("--latency-seconds", default="10", help="Length of each pickup-latency run. Default 10.")
        parser.add_argument("--concurrency", default="4", help="shardq_worker --concurrency. Default 4.")
        parser.add_argument("--only", default="", help=f"Comma-separated phases to run: {', '.join(PHASES)} "
                            "(a partial run does not update docs/benchmarks.md).")
        parser.add_argument("--database", default="shardq_bench",
                            help="Name of the bench's own database on DATABASE_URL's server (created and "
                                 "migrated; its shardq tables are emptied). Default shardq_bench.")
        parser.add_argument("--no-docs", action="store_true", help="Do not rewrite docs/benchmarks.md and the plot.")

    def handle(self, *args, **options):
        if not (REPO / "bench" / "e2e.py").exists() or not (REPO / "tests" / "settings.py").exists():
            raise CommandError("shardq_bench runs from a checkout of the shardq repository (it needs bench/ and tests/).")
        phases = tuple(p.strip() for p in options["only"].split(",") if p.strip()) or PHASES
        unknown = [p for p in phases if p not in PHASES]
        if unknown:
            raise CommandError(f"--only names unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}.")
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from bench import e2e

        try:
            url = e2e.bench_database(options["database"])
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        try:
            latency_seconds = float(options["latency_seconds"])
        except ValueError:
            latency_seconds = 0.0
        if latency_seconds <= 0:
            raise CommandError(f"--latency-seconds must be a number > 0, not {options['latency_seconds']!r}.")
        bench_options = e2e.Options(
            database_url=url,
            jobs=count("jobs", options["jobs"], 100),
            reps=count("reps", options["reps"]),
            repeat=count("repeat", options["repeat"]),
            backlog=1_000_000 if options["full"] else 200_000,
            latency_seconds=latency_seconds,
            concurrency=count("concurrency", options["concurrency"]),
            phases=phases,
            write_docs=not options["no_docs"],
        )
        e2e.run(bench_options)
