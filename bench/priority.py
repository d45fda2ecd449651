"""The priority figures of ``make bench`` (its ``priority`` phase, issue 12).

* **Pickup behind a backlog**: one worker drains READY priority-0 no-op jobs;
  every ``interval`` seconds a child process tops the READY backlog up to
  ``backlog`` jobs and enqueues one priority-100 ``stamp`` job through the
  public API. Pickup = the moment the task ran (``stamp`` returns
  ``time.time()``) − its ``enqueued_at`` (the database's clock, on the same
  host): what a user waits for, including the jobs the worker had already
  started ahead of it. p50, p99 and max over ``samples`` jobs.
* **Order**: one worker with one thread (``--concurrency 1``) drains a
  backlog of ``stamp`` jobs of mixed priorities over all 64 shards; the
  stamps give the order they ran in. Counted: the times a job ran right
  after one of lower priority, after the first buffer fill (concurrency +
  the default prefetch of 512: the first claim may come before the worker
  holds every shard). Also the drain rate of that backlog, which shows what
  taking the work level by level costs.
"""

import random
import time

from bench import limit

PREFETCH = 512  # shardq_worker's default --prefetch
LEVELS = (-5, 0, 0, 0, 2, 10, 20, 100)  # a few levels, most jobs at 0


def pickup(bench, samples: int = 200, interval: float = 0.05, backlog: int = 10_000) -> dict:
    """Pickup (ms) of priority-100 jobs enqueued behind ``backlog`` READY priority-0 jobs."""
    bench.reset()
    limit.fill(bench.url, backlog)
    proc = bench.start_worker(1, name="priority-pickup")
    try:
        bench.wait_for(lambda: bench.shards_held() == limit.SHARD_COUNT, 60, "the worker to hold every shard", proc)
        ids = bench.api("urgent", samples, interval, backlog)["ids"]
        bench.wait_for(
            lambda: (
                bench.sql("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [ids])[0][0]
                == len(ids)
            ),
            60,
            "the priority-100 jobs to run",
            proc,
        )
        waiting = bench.sql("SELECT count(*) FROM shardq_job WHERE status = 'READY'")[0][0]
    finally:
        bench.stop_worker(proc)
    p50, p99, worst, db_p99 = bench.sql(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),"
        " max(ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY db_ms)"
        " FROM (SELECT ((return_value #>> '{}')::float8 - extract(epoch FROM enqueued_at)::float8) * 1000 AS ms,"
        "              extract(epoch FROM last_attempted_at - enqueued_at)::float8 * 1000 AS db_ms"
        "       FROM shardq_job WHERE id = ANY(%s)) AS l",
        [ids],
    )[0]
    return {
        "samples": len(ids),
        "backlog": backlog,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": worst,
        # The start as the table records it (the claim's or the start write's
        # time): up to AHEAD_SECONDS before the task really ran.
        "recorded_start_p99_ms": db_p99,
        "ready_left_at_end": waiting,
    }


def order(bench, jobs: int = 5000, levels: tuple[int, ...] = LEVELS, seed: int = 12) -> dict:
    """Rises in the run order of a mixed backlog drained by one worker with one thread."""
    bench.reset()
    rng = random.Random(seed)
    priorities = [rng.choice(levels) for _ in range(jobs)]
    bench.sql(
        """
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
            key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
            args, kwargs, errors, worker_ids, enqueued_at)
        SELECT 'tests.taskapp.tasks.stamp', 'default', 'default', p, t, h & 63, h, NULL, false, 'READY', 0, 0, 0, 1,
               '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, t
        FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, clock_timestamp() AS t, p
              FROM unnest(%s::int[]) AS p) AS g
        """,
        [priorities],
    )
    bench.sql("ANALYZE shardq_job")
    proc = bench.start_worker(1, name="priority-order", concurrency=1)
    try:
        bench.wait_empty(timeout=max(300.0, jobs / 50), proc=proc)
    finally:
        bench.stop_worker(proc)
    ran = bench.sql(
        "SELECT priority, (return_value #>> '{}')::float8 FROM shardq_job WHERE status = 'SUCCESSFUL' ORDER BY 2"
    )
    first_fill = 1 + PREFETCH
    run_order = [priority for priority, _ in ran]
    rises = sum(1 for i in range(1, len(run_order)) if run_order[i] > run_order[i - 1])
    rises_after_fill = sum(1 for i in range(first_fill + 1, len(run_order)) if run_order[i] > run_order[i - 1])
    span = ran[-1][1] - ran[0][1] if len(ran) > 1 else 0.0
    return {
        "jobs": len(ran),
        "levels": sorted(set(levels)),
        "rises": rises,
        "rises_after_first_fill": rises_after_fill,
        "rate": (len(ran) - 1) / span if span else None,
    }


def run(bench, samples: int = 200) -> dict:
    started = time.monotonic()
    out = {"pickup": pickup(bench, samples=samples)}
    bench.step("priority-100 pickup behind 10,000 jobs")
    out["order"] = order(bench)
    # Every priority of Django's range in one backlog: the most levels a
    # claim can meet (each claim takes one level, or a lone leading shard's
    # jobs down to the next level).
    out["order_201_levels"] = order(bench, levels=tuple(range(-100, 101)))
    bench.step("mixed-priority drain order")
    out["seconds"] = time.monotonic() - started
    return out
