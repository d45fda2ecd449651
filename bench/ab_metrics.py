"""What metrics cost the drain: the uniform no-op drain with and without
``--metrics-port``, alternating, so both see the same machine load.

    DATABASE_URL=... .venv/bin/python bench/ab_metrics.py [--rounds 6] [--jobs 20000] [--processes 1]

Each round drains ``--jobs`` READY no-op jobs with one ``shardq_worker
--processes N --concurrency 4`` without metrics and one with
``--metrics-port`` (which goes first alternates), exactly as
``Bench.shardq_drain``; the metrics run is scraped once a second, as
Prometheus would (more often than its usual 15 s). Prints each round and the
medians of on ÷ off per round (wall: start of the command → all done;
steady: first → last ``finished_at``). For metrics off against a checkout
without metrics, use ``bench/ab_drain.py``.
"""

import argparse
import os
import socket
import statistics
import sys
import threading
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scraper(port: int, stop: threading.Event) -> None:
    """Scrape once a second until ``stop`` (a refused connection: not up yet)."""
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                response.read()
        except OSError:
            pass


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/ab_metrics.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--database", default="shardq_bench")
    args = p.parse_args()
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    bench = e2e.Bench(e2e.Options(database_url=e2e.bench_database(args.database), jobs=args.jobs))
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    try:
        for round_ in range(args.rounds):
            order = ["off", "on"] if round_ % 2 == 0 else ["on", "off"]
            for label in order:
                flags: tuple[str, ...] = ()
                stop = threading.Event()
                if label == "on":
                    port = free_port()
                    flags = ("--metrics-port", str(port))
                    threading.Thread(target=scraper, args=(port, stop), daemon=True).start()
                try:
                    result = bench.shardq_drain(args.processes, args.jobs, name=f"metrics-{label}", flags=flags)
                finally:
                    stop.set()
                runs[label].append(result)
                print(
                    f"round {round_ + 1} metrics {label:3} wall {result['wall_rate']:8,.0f} jobs/s"
                    f"  steady {result['steady_rate'] or 0:8,.0f} jobs/s",
                    flush=True,
                )
    finally:
        bench.reset()
        bench.conn.close()
    for what in ("wall_rate", "steady_rate"):
        ratios = [n[what] / f[what] for n, f in zip(runs["on"], runs["off"], strict=True) if f[what] and n[what]]
        print(
            f"{what}: on ÷ off median of rounds {statistics.median(ratios):.3f}"
            f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); medians: off"
            f" {statistics.median(r[what] for r in runs['off']):,.0f}, on"
            f" {statistics.median(r[what] for r in runs['on']):,.0f} jobs/s"
        )


if __name__ == "__main__":
    main()
