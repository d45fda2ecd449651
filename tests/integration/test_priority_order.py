"""Priority orders the work (issue 12, item 2), with a worker in this process.

Django's docs say a larger priority "will be run sooner". One worker with one
thread makes the order observable: the ledger task writes one row per
execution, and the ledger's serial id is the order the worker ran them in.
The jobs have no key, so they spread over all 64 shards. The worker runs
with the settings a user keeps (the poll interval; the look-ahead is
smaller in CI, see JOBS).
"""

import os
import random

import pytest

import shardq
from tests.helpers import in_process_worker, scalar, sql, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

# CI size: 400 jobs through a look-ahead of 32 (the order is checked after
# the first fill, so the smaller buffer keeps as many places checked);
# SHARDQ_FULL_ACCEPTANCE=1 (`make acceptance-full`): 2,000 jobs at the
# default look-ahead of 512.
FULL = os.environ.get("SHARDQ_FULL_ACCEPTANCE") == "1"
JOBS, PREFETCH = (2000, 512) if FULL else (400, 32)


@pytest.fixture
def user_settings(settings):
    """The default poll interval: the tests must not depend on polling to find the jobs that matter."""
    settings.SHARDQ = {**settings.SHARDQ, "POLL_INTERVAL": 1.0}


def execution_order() -> list[tuple[int, int]]:
    """(job id, priority) of every execution, in the order the worker ran them."""
    return sql("SELECT j.id, j.priority FROM taskapp_ledger AS l JOIN shardq_job AS j ON j.id = l.job_id ORDER BY l.id")


def enqueue_with_priority(priority: int, count: int, **kwargs) -> list[int]:
    results = shardq.enqueue_many(tasks.ledger.using(priority=priority), [((), kwargs)] * count)
    return [int(result.id) for result in results]


def test_one_worker_runs_a_mixed_backlog_in_priority_order_after_its_first_fill(user_settings):
    rng = random.Random(12)
    levels = [-5, 0, 0, 0, 2, 10, 20, 100]
    by_priority: dict[int, int] = {}
    for _ in range(JOBS):
        priority = rng.choice(levels)
        by_priority[priority] = by_priority.get(priority, 0) + 1
    for priority, count in by_priority.items():
        enqueue_with_priority(priority, count)
    # Keyless jobs land on random shards: 400 of them leave a shard empty
    # about one run in eight, so the check is that they spread widely.
    assert scalar("SELECT count(DISTINCT shard) FROM shardq_job") >= 56

    with in_process_worker(concurrency=1, prefetch=PREFETCH):
        wait_until(
            lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == JOBS,
            timeout=240,
            message="the backlog to drain",
        )

    assert dict(sql("SELECT status, count(*) FROM shardq_job GROUP BY 1")) == {"SUCCESSFUL": JOBS}
    ran = [priority for _, priority in execution_order()]
    assert len(ran) == JOBS
    # The first claim may come before the worker holds every shard; after
    # that, a claim never leaves a job in the table that outranks one it
    # takes. A first fill is at most the buffer: concurrency + prefetch.
    first_fill = 1 + PREFETCH
    rises = [
        (place, ran[place - 1], ran[place]) for place in range(first_fill + 1, len(ran)) if ran[place] > ran[place - 1]
    ]
    assert rises == [], f"{len(rises)} times a job ran after a lower-priority one, first: {rises[:5]}"


def test_priority_100_jobs_start_before_every_priority_0_job_still_waiting_when_they_were_enqueued(user_settings):
    # 5 ms a job: the backlog lasts about 10 s, so it is far from drained
    # when the urgent jobs arrive.
    enqueue_with_priority(0, 2000, sleep=0.005)
    with in_process_worker(concurrency=1):
        wait_until(
            lambda: scalar("SELECT count(*) FROM taskapp_ledger") >= 200,
            timeout=60,
            message="the worker to be well into the backlog",
        )

        urgent = enqueue_with_priority(100, 8)
        committed = scalar("SELECT clock_timestamp()")
        # A claim that began before the commit did not see the urgent jobs and
        # may still be taking backlog jobs (READY to this connection until it
        # commits): those are already in the worker's hands. Wait for such a
        # claim to end, then read what is left: a job of the backlog still
        # READY now can only be taken by a claim that sees the urgent jobs.
        wait_until(
            lambda: (
                not scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name IN ('shardq-fetcher', 'shardq-outrank') AND state <> 'idle' "
                    "AND xact_start < %s",
                    [committed],
                )
            ),
            timeout=30,
            message="the claims begun before the urgent jobs' commit to end",
        )
        waiting = {row[0] for row in sql("SELECT id FROM shardq_job WHERE status = 'READY' AND priority = 0")}
        assert len(waiting) > 1000, "the backlog must still be large when the urgent jobs arrive"
        wait_until(
            lambda: (
                scalar("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [urgent]) == 8
            ),
            timeout=60,
            message="the priority-100 jobs to run",
        )

    order = [job_id for job_id, _ in execution_order()]
    last_urgent = max(order.index(job_id) for job_id in urgent)
    overtaken = [job_id for job_id in order[:last_urgent] if job_id in waiting]
    assert overtaken == [], (
        f"{len(overtaken)} priority-0 jobs still waiting in the table when the priority-100 jobs were "
        f"enqueued ran before the last of them"
    )
