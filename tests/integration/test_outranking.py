"""A job that outranks everything in a worker's memory overtakes it: its
NOTIFY (``shard:priority``) has the listener claim it outside demand
(``Fetcher.outrank``) into the local queue, whose next free thread takes
the best job there.

The worker runs in this process with one thread, held by a ``gate`` task
while jobs pile up buffered behind it (CLAIMED: a job is started only by
the thread that begins it), so the order is decided while nothing runs: no
timing in the assertions.
"""

import pytest

import shardq
from tests.helpers import in_process_worker, sql, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker():
    """One thread, all 64 shards; the gate is open again afterwards."""
    tasks.GATE.clear()
    with in_process_worker(concurrency=1) as worker:
        try:
            yield worker
        finally:
            tasks.GATE.set()  # before the worker stops: a gated task would hold it


def status(result) -> str:
    result.refresh()
    return result.status


def test_a_priority_100_job_runs_before_the_jobs_started_ahead_of_a_busy_thread(worker):
    # Measured short tasks first: the demand then buffers many.
    shardq.enqueue_many(tasks.stamp, [((), {})] * 200)
    wait_until(lambda: worker.stats["succeeded"] >= 200, timeout=30, message="the first no-op jobs")
    held = tasks.gate.using(priority=50).enqueue()
    wait_until(lambda: status(held) == "RUNNING", timeout=30, message="the gate to hold the thread")
    shardq.enqueue_many(tasks.stamp, [((), {})] * 2000)
    # The buffer fills behind the held thread; then the fetcher waits for room.
    wait_until(
        lambda: worker.buffer.buffered >= 100 and worker.fetcher.waiting_for_slots,
        timeout=30,
        message=lambda: f"jobs buffered ({worker.buffer.buffered})",
    )
    buffered = [
        row[0] for row in sql("SELECT id FROM shardq_job WHERE status = 'CLAIMED' AND priority = 0 ORDER BY id")
    ]
    assert len(buffered) >= 100
    # Claimed is not started: only the gate's thread's job reads RUNNING.
    assert sql("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING'") == [(1,)]

    urgent = tasks.stamp.using(priority=100).enqueue()
    [(shard,)] = sql("SELECT shard FROM shardq_job WHERE id = %s", [int(urgent.id)])

    def claimed_out_of_turn() -> bool:
        if status(urgent) == "CLAIMED" or worker.buffer.holds(int(urgent.id)):
            return True
        if status(urgent) == "READY":
            # Its NOTIFY again: on a loaded machine the lease's trust can
            # lapse for a moment, and a claim is then refused (a lost
            # NOTIFY, which the poll would cover once the thread is free).
            sql("SELECT pg_notify('shardq', %s)", [f"{shard}:100"])
        return False

    wait_until(
        claimed_out_of_turn,
        timeout=30,
        interval=0.3,
        message=lambda: f"the priority-100 job to be claimed out of turn ({status(urgent)}, {worker.stats.snapshot()})",
    )
    assert worker.stats["outranking_claims"] >= 1
    tasks.GATE.set()
    wait_until(lambda: status(urgent) == "SUCCESSFUL", timeout=30, message="the priority-100 job to run")

    ran_before = sql(
        "SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL' "
        "AND (return_value #>> '{}')::float8 < %s",
        [buffered, urgent.return_value],
    )[0][0]
    assert ran_before == 0, f"{ran_before} of {len(buffered)} jobs buffered before it ran before the priority-100 job"


def test_a_notify_of_a_priority_no_higher_than_the_buffer_claims_nothing_outside_demand(worker):
    shardq.enqueue_many(tasks.stamp, [((), {})] * 200)
    wait_until(lambda: worker.stats["succeeded"] >= 200, timeout=30, message="the first no-op jobs")
    held = tasks.gate.using(priority=50).enqueue()
    wait_until(lambda: status(held) == "RUNNING", timeout=30, message="the gate to hold the thread")
    shardq.enqueue_many(tasks.stamp, [((), {})] * 2000)
    wait_until(
        lambda: worker.buffer.buffered >= 100 and worker.fetcher.waiting_for_slots,
        timeout=30,
        message="jobs buffered",
    )
    before = worker.buffer.buffered
    # Equal priority (0): a job, and a spoofed NOTIFY.
    tasks.stamp.enqueue()
    sql("SELECT pg_notify('shardq', '0:0')")
    # Then spoofed NOTIFYs that do outrank the buffer, with no such job: a
    # claim each that finds nothing (sent again until one is counted: a
    # claim is refused while the lease's trust lapses on a loaded machine).
    # The listener reads NOTIFYs in order, so by then the first two were
    # read, and asked for no claim.
    sent = []

    def claimed() -> bool:
        if worker.stats["outranking_claims"]:
            return True
        sent.append(sql("SELECT pg_notify('shardq', '0:100')"))
        return False

    wait_until(claimed, timeout=30, interval=0.3, message="the claim")
    assert worker.stats["outranking_claims"] <= len(sent)
    # The job of equal priority was not claimed outside demand.
    assert worker.buffer.buffered == before
