"""Fault 5: the LISTEN connection is killed every 2 s, so NOTIFYs are lost
while it reconnects — every job is still picked up within the poll interval
plus 0.5 s (the polling fallback)."""

import random
import time

from tests.faults.harness import (
    BackendKiller,
    Repeating,
    check_invariants,
    figures,
    percentile,
    size,
    wait_all_finished,
)
from tests.helpers import wait_until
from tests.taskapp import fault_tasks
from tests.workers import query, shards_by_owner, worker_id_of

POLL_SECONDS = 1.0  # longer than the suite's 0.2 s, so a lost NOTIFY shows
KILL_EVERY = 2.0
RUN_SECONDS = size(15, 60)


def test_jobs_are_picked_up_within_the_poll_interval_while_listen_keeps_dying(workers, injector):
    worker = workers.start("--concurrency", "4", env={"SHARDQ_POLL_INTERVAL": str(POLL_SECONDS)})
    worker_id = worker_id_of(worker.pid)
    wait_until(lambda: shards_by_owner() == {worker_id: 64}, timeout=60)
    rng = random.Random(5)
    killer = BackendKiller(injector, pattern="shardq-listener")
    kills = Repeating(killer, KILL_EVERY, "listener-killer")
    kills.start()
    jobs = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < RUN_SECONDS:
            fault_tasks.acked.enqueue(n=jobs)
            jobs += 1
            time.sleep(rng.uniform(0.05, 0.4))  # pacing the enqueues around the kills
    finally:
        kills.stop()
    wait_all_finished(query, jobs, timeout=60)

    latencies = [
        float(s) for (s,) in query("SELECT extract(epoch FROM started_at - enqueued_at) FROM shardq_job ORDER BY id")
    ]
    report = check_invariants(query, expected_jobs=jobs)
    figures(
        "notify_loss",
        jobs=jobs,
        listener_kills=killer.killed.get("shardq-listener", 0),
        pickup_p50=percentile(latencies, 50),
        pickup_p99=percentile(latencies, 99),
        pickup_max=max(latencies),
        bound=POLL_SECONDS + 0.5,
        lost=report["lost"],
    )
    assert killer.killed.get("shardq-listener", 0) >= RUN_SECONDS // KILL_EVERY - 1
    assert worker.poll() is None
    assert max(latencies) <= POLL_SECONDS + 0.5, sorted(latencies)[-5:]
