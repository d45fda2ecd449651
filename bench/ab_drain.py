"""A/B of the uniform drain: ``make bench``'s shardq drain, run from two
checkouts in one run, alternating, so both see the same machine load.

    DATABASE_URL=... .venv/bin/python bench/ab_drain.py BASELINE_CHECKOUT [--rounds 6] [--jobs 20000]

Each round drains ``--jobs`` READY priority-0 no-op jobs with one
``shardq_worker --processes 1 --concurrency 4`` of the baseline checkout and
one of this checkout (which goes first alternates), exactly as
``Bench.shardq_drain``. Prints each round and the medians of this ÷ baseline
per round (wall: start of the command → all done; steady: first → last
``finished_at``; cpu: the worker's CPU time per job over that window). The baseline checkout must run with this virtualenv (for
example ``git archive <commit> | tar -x -C DIR``). With ``--limit`` each round
starts with ``make bench``'s bare-SQL limit drain, and each checkout is
also reported ÷ the limit (the issue 13 figures).
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/ab_drain.py", description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", type=Path, help="checkout to compare against")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--database", default="shardq_bench")
    p.add_argument(
        "--limit",
        action="store_true",
        help="also drain with the bare-SQL limit (make bench's) each round, first, and report each "
        "checkout ÷ the limit (median of the per-round ratios)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="also drain this checkout with django.tasks at WARNING (tests.settings' LOGGING) each round",
    )
    args = p.parse_args()
    baseline = args.baseline.resolve()
    if not (baseline / "manage.py").exists():
        sys.exit(f"{baseline} is not a shardq checkout (no manage.py)")
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    bench = e2e.Bench(e2e.Options(database_url=e2e.bench_database(args.database), jobs=args.jobs))
    runs: dict[str, list[dict]] = {"baseline": [], "this": [], "limit": [], "quiet": []}
    try:
        for round_ in range(args.rounds):
            if args.limit:
                result = bench.limit_drain(1, args.jobs)
                runs["limit"].append(result)
                print(
                    f"round {round_ + 1} limit    wall {result['wall_rate']:8,.0f} jobs/s"
                    f"  steady {result['steady_rate'] or 0:8,.0f} jobs/s"
                    f"  cpu {result.get('cpu_us_per_job') or 0:6.1f} µs/job",
                    flush=True,
                )
            order = [("baseline", baseline), ("this", REPO)]
            if round_ % 2:
                order.reverse()
            if args.quiet:
                order.append(("quiet", REPO))
            for label, checkout in order:
                bench.repo = checkout
                settings = e2e.QUIET_TASK_LOGGING if label == "quiet" else e2e.DEFAULT_LOGGING
                result = bench.shardq_drain(1, args.jobs, name=f"ab-{label}", settings=settings)
                runs[label].append(result)
                print(
                    f"round {round_ + 1} {label:8} wall {result['wall_rate']:8,.0f} jobs/s"
                    f"  steady {result['steady_rate'] or 0:8,.0f} jobs/s"
                    f"  cpu {result.get('cpu_us_per_job') or 0:6.1f} µs/job",
                    flush=True,
                )
    finally:
        bench.reset()
        bench.conn.close()
    if args.limit:
        for what in ("wall_rate", "steady_rate", "cpu_us_per_job"):
            for label in ("baseline", "this", *(("quiet",) if args.quiet else ())):
                ratios = [
                    t[what] / lim[what]
                    for t, lim in zip(runs[label], runs["limit"], strict=True)
                    if lim[what] and t[what]
                ]
                print(
                    f"{what}: {label} ÷ limit median of rounds {statistics.median(ratios):.3f}"
                    f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); limit median"
                    f" {statistics.median(r[what] for r in runs['limit']):,.1f}"
                )
    for what in ("wall_rate", "steady_rate", "cpu_us_per_job"):
        ratios = [t[what] / b[what] for t, b in zip(runs["this"], runs["baseline"], strict=True) if b[what] and t[what]]
        print(
            f"{what}: this ÷ baseline median of rounds {statistics.median(ratios):.3f}"
            f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); medians: baseline"
            f" {statistics.median(r[what] for r in runs['baseline']):,.1f}, this"
            f" {statistics.median(r[what] for r in runs['this']):,.1f}"
            f" {'µs/job (worker CPU, steady state)' if what == 'cpu_us_per_job' else 'jobs/s'}"
        )


if __name__ == "__main__":
    main()
