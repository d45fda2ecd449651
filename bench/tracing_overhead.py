"""What OpenTelemetry costs the drain when it is installed but not set up:
the uniform no-op drain with ``opentelemetry-api`` importable and no SDK
configured (every attempt gets the API's no-op span) against the same
worker with the API hidden (``shardq.tracing.enabled`` False: no span code
runs), alternating, so both see the same machine load.

    DATABASE_URL=... .venv/bin/python bench/tracing_overhead.py [--rounds 6] [--jobs 20000]

Each round drains ``--jobs`` READY no-op jobs with one ``shardq_worker
--processes 1 --concurrency 4`` per side (which goes first alternates),
exactly as ``Bench.shardq_drain``. The API is hidden by a directory put first
on the worker's PYTHONPATH whose ``opentelemetry`` package raises
ImportError, as if it were not installed. Prints each round and the medians
of no-op ÷ absent per round (wall: start of the command → all done; steady:
first → last ``finished_at``); issue 28 asks for ≥ 0.98.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def hidden_api_dir() -> str:
    """A directory whose ``opentelemetry`` package cannot be imported."""
    path = Path(tempfile.mkdtemp(prefix="shardq-no-otel-"))
    (path / "opentelemetry").mkdir()
    (path / "opentelemetry" / "__init__.py").write_text(
        'raise ImportError("opentelemetry hidden by bench/tracing_overhead.py")\n'
    )
    return str(path)


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/tracing_overhead.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--database", default="shardq_bench")
    args = p.parse_args()
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    bench = e2e.Bench(e2e.Options(database_url=e2e.bench_database(args.database), jobs=args.jobs))
    hidden = hidden_api_dir()
    side = {"label": "noop"}
    child_env = bench.child_env

    def env_of_side(*a, **extra):
        env = child_env(*a, **extra)
        if side["label"] == "absent":
            env["PYTHONPATH"] = os.pathsep.join([hidden, env.get("PYTHONPATH", str(REPO))])
        return env

    bench.child_env = env_of_side  # type: ignore[method-assign]
    runs: dict[str, list[dict]] = {"absent": [], "noop": []}
    try:
        for round_ in range(args.rounds):
            for label in ["absent", "noop"] if round_ % 2 == 0 else ["noop", "absent"]:
                side["label"] = label
                result = bench.shardq_drain(1, args.jobs, name=f"tracing-{label}")
                runs[label].append(result)
                print(
                    f"round {round_ + 1} otel {label:6} wall {result['wall_rate']:8,.0f} jobs/s"
                    f"  steady {result['steady_rate'] or 0:8,.0f} jobs/s",
                    flush=True,
                )
    finally:
        bench.reset()
        bench.conn.close()
    for key in ("wall_rate", "steady_rate"):
        ratios = [
            on[key] / off[key] for on, off in zip(runs["noop"], runs["absent"], strict=True) if on[key] and off[key]
        ]
        print(
            f"median no-op ÷ absent ({key}): {statistics.median(ratios):.3f}  (rounds: "
            + ", ".join(f"{r:.3f}" for r in ratios)
            + ")"
        )


if __name__ == "__main__":
    main()
