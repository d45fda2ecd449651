"""The cost of concurrency limits (issue 15, docs/limits.md): A/B drains, alternated rounds.

    .venv/bin/python bench/limits.py [--rounds 3] [--jobs 20000] [--sleepers 6000]

* **generous**: ``--jobs`` READY no-op jobs drained by one worker
  (``--concurrency 4``): a task with ``max_concurrency=1000`` (every job
  goes through the limited claim: candidates, slots SKIP LOCKED, claim)
  against a task with no limit. Target: >= 0.8x.
* **river**: ``--sleepers`` READY jobs sleeping 10 ms, drained by four
  worker commands of concurrency 10: ``max_concurrency=40`` (River's
  GlobalLimit 40 over 4 clients, river#1145) against no limit. Target: >= 0.9x.
* **by_key**: ``--jobs`` READY no-op jobs over 1,000 keys drained by one
  worker (``--concurrency 4``): ``max_concurrency=2, limit_by`` the shard key,
  written as enqueue writes it (``key_limited``: the key's owner keeps the
  limit in its local queue), against the same keyed task with no limit.
* **by_key_slots**: the same limit through the slot table (a ``limit_keys``
  key per customer, as enqueue wrote it before the local path, and as it
  still writes a partition that is not the shard key): what the local path
  saves (docs/limits.md, "Limits by the shard key").

Rate = jobs / (first start .. last finish, from the rows). Prints one JSON
document. Used by ``make bench`` (phase ``limits``) and on its own.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GENEROUS = "tests.taskapp.limit_tasks.generous_noop"
NOOP = "tests.taskapp.tasks.noop"
FORTY = "tests.taskapp.limit_tasks.forty_at_once"
SLEEPER = "tests.taskapp.limit_tasks.unlimited_sleep"
PER_KEY = "tests.taskapp.limit_tasks.two_per_key_noop"
KEYED = "tests.taskapp.limit_tasks.keyed_noop"
KEYS = 1000


def fill(bench, task: str, n: int, limited: bool, kwargs: str = "{}", keyed: bool = False, local: bool = False) -> None:
    """``n`` READY jobs of ``task`` in one statement (setup, not measured),
    with the task's own limit key when ``limited``, as enqueue writes it;
    ``keyed``: over KEYS customers (kwargs {"customer": c}, one shard per
    key, a partitioned limit key per customer when ``limited``, or, with
    ``local``, key_limited and no limit key)."""
    bench.sql(
        """
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
            key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
            args, kwargs, errors, worker_ids, enqueued_at, limit_keys, key_limited)
        SELECT %(task)s::text, 'default', 'default', 0, t, h & 63, h,
               CASE WHEN %(keyed)s THEN c::text END, false, 'READY', 0, 0, 0, 1,
               '[]'::jsonb, CASE WHEN %(keyed)s THEN jsonb_build_object('customer', c) ELSE %(kwargs)s::jsonb END,
               '[]'::jsonb, '[]'::jsonb, t,
               CASE WHEN %(limited)s AND %(keyed)s AND NOT %(local)s THEN jsonb_build_array('t:' || %(task)s::text || '=' || c)
                    WHEN %(limited)s AND NOT %(keyed)s THEN jsonb_build_array('t:' || %(task)s::text) END,
               %(limited)s AND %(keyed)s AND %(local)s
        FROM (SELECT CASE WHEN %(keyed)s THEN hashint4(g %% %(keys)s) ELSE (random() * 4294967295 - 2147483648)::bigint::int END AS h,
                     g %% %(keys)s AS c, clock_timestamp() AS t
              FROM generate_series(1, %(n)s) AS g) AS g
        """,
        {"task": task, "n": n, "limited": limited, "kwargs": kwargs, "keyed": keyed, "keys": KEYS, "local": local},
    )
    bench.sql("ANALYZE shardq_job")


def drain(
    bench,
    task: str,
    n: int,
    limited: bool,
    workers: int,
    concurrency: int,
    kwargs: str = "{}",
    keyed: bool = False,
    local: bool = False,
) -> dict:
    bench.reset()
    bench.sql("TRUNCATE shardq_limit_slot, shardq_limit_rate")
    fill(bench, task, n, limited, kwargs, keyed, local)
    procs = [bench.start_worker(1, name=f"limits-{i}", concurrency=concurrency) for i in range(workers)]
    try:
        bench.wait_empty(timeout=max(300.0, n / 20), proc=procs[0])
    finally:
        for proc in procs:
            bench.stop_worker(proc)
    done, first, last = bench.sql(
        "SELECT count(*), extract(epoch FROM min(last_attempted_at))::float8,"
        " extract(epoch FROM max(finished_at))::float8 FROM shardq_job WHERE status = 'SUCCESSFUL'"
    )[0]
    peak = bench.sql("SELECT count(*) FROM shardq_limit_slot")[0][0]
    return {"jobs": done, "rate": done / (last - first), "slot_rows": peak}


def ab(
    bench,
    rounds: int,
    *,
    limited_task: str,
    plain_task: str,
    n: int,
    workers: int,
    concurrency: int,
    kwargs="{}",
    keyed=False,
    local=False,
):
    runs: dict[str, list[dict]] = {"limited": [], "unlimited": []}
    for i in range(rounds):
        # Alternated, and the side that goes first alternates too.
        order = ("unlimited", "limited") if i % 2 == 0 else ("limited", "unlimited")
        for side in order:
            task = limited_task if side == "limited" else plain_task
            runs[side].append(drain(bench, task, n, side == "limited", workers, concurrency, kwargs, keyed, local))
            bench.step(f"limits: {side} {task.rsplit('.', 1)[1]}")
    ratios = [lim["rate"] / free["rate"] for lim, free in zip(runs["limited"], runs["unlimited"], strict=True)]
    return {
        "limited_rate": statistics.median(r["rate"] for r in runs["limited"]),
        "unlimited_rate": statistics.median(r["rate"] for r in runs["unlimited"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "runs": runs,
    }


CASES = ("generous", "river", "by_key", "by_key_slots")
LABELS = {
    "generous": "generous max_concurrency=1000, no-op",
    "river": "max_concurrency=40 over 4 workers, 10 ms",
    "by_key": "max_concurrency=2 limit_by the shard key (local queue), 1,000 keys, no-op",
    "by_key_slots": "the same through the slot table",
}


def run(bench, rounds: int, jobs: int, sleepers: int = 6000, cases: tuple[str, ...] = CASES) -> dict:
    per_key = dict(limited_task=PER_KEY, plain_task=KEYED, n=jobs, workers=1, concurrency=4, keyed=True)
    plans = {
        "generous": lambda: ab(bench, rounds, limited_task=GENEROUS, plain_task=NOOP, n=jobs, workers=1, concurrency=4),
        "river": lambda: ab(
            bench,
            rounds,
            limited_task=FORTY,
            plain_task=SLEEPER,
            n=sleepers,
            workers=4,
            concurrency=10,
            kwargs='{"sleep": 0.01}',
        ),
        "by_key": lambda: ab(bench, rounds, **per_key, local=True),
        "by_key_slots": lambda: ab(bench, rounds, **per_key),
    }
    return {case: plans[case]() for case in cases}


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/limits.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--sleepers", type=int, default=6000)
    p.add_argument("--database", default="shardq_bench")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    args = p.parse_args()
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e

    url = e2e.bench_database(args.database)
    options = e2e.Options(database_url=url, phases=("limits",), write_docs=False, rounds=args.rounds, jobs=args.jobs)
    bench = e2e.Bench(options)
    started = time.monotonic()
    try:
        raw = run(bench, args.rounds, args.jobs, args.sleepers, cases)
    finally:
        bench.reset()
        bench.conn.close()
    raw["seconds"] = time.monotonic() - started
    print(json.dumps(raw, indent=2))
    for case in cases:
        r = raw[case]
        print(
            f"{LABELS[case]}: {r['limited_rate']:.0f} vs {r['unlimited_rate']:.0f} jobs/s unlimited, "
            f"ratio {r['ratio']:.2f} (rounds {', '.join(f'{x:.2f}' for x in r['ratios'])})"
        )


if __name__ == "__main__":
    main()
