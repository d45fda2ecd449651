"""Worker boot, process start to first job started, by stage (issue 24).

    DATABASE_URL=... .venv/bin/python bench/boot.py [--rounds 5]

Each round: empty the bench database's jobs, enqueue one no-op job, start
``manage.py shardq_worker --concurrency 4`` (the test settings), and wait for
the job. "to first start" is the job's ``started_at`` (the database clock)
minus the wall time just before the process was spawned (this machine's one
clock); the stages come from the worker's own ``boot:`` log line. Prints a
table of medians; writes bench/results/boot.json.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
STAGE = re.compile(r"([a-z][a-z ]+?) (\d+) ms")


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/boot.py", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    url = os.environ.get("DATABASE_URL")
    if not url:
        sys.exit("set DATABASE_URL to a migrated database of tests.settings (e.g. the bench's)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONUNBUFFERED": "1"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE shardq_job; DELETE FROM shardq_worker")
            conn.execute("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import django; django.setup(); from tests.taskapp.tasks import noop; noop.enqueue()",
            ],
            cwd=REPO,
            env=env,
            check=True,
        )
        spawned = time.time()
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "shardq_worker", "--concurrency", "4"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            started = None
            deadline = time.monotonic() + 60
            with psycopg.connect(url, autocommit=True) as conn:
                while started is None and time.monotonic() < deadline:
                    row = conn.execute("SELECT extract(epoch FROM started_at) FROM shardq_job").fetchone()
                    started = row[0] if row and row[0] is not None else None
                    time.sleep(0.005)
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=60)
        if started is None:
            sys.exit(f"no job started within 60 s; the worker printed:\n{out}")
        figures = {"to first start": float(started) - spawned}
        line = next((ln for ln in out.splitlines() if " boot: " in ln), "")
        for stage, ms in STAGE.findall(line.split(" boot: ", 1)[-1]):
            figures[stage.strip()] = int(ms) / 1000
        rounds.append(figures)
    names = list(dict.fromkeys(name for r in rounds for name in r))
    print(f"worker boot over {args.rounds} rounds (medians, seconds)")
    for name in names:
        values = [r[name] for r in rounds if name in r]
        print(f"  {name:28s} {statistics.median(values):7.3f}   ({', '.join(f'{v:.3f}' for v in values)})")
    results = REPO / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "boot.json").write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
