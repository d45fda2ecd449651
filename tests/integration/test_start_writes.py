"""Start writes (shardq/worker/starter.py): a job reads RUNNING, gets its
``started_at`` and uses an attempt only when a thread begins it, and threads
that begin together share one statement (group commit). Real PostgreSQL: a
second connection holds a row lock to make a group gather while the first
write waits, so no timing decides what is asserted."""

import threading
import uuid

import pytest

from shardq.db.store import WorkerStore, ensure_shards
from shardq.worker.jobs import STARTED, ClaimedJob
from shardq.worker.starter import LOST, UNAVAILABLE, StartWrites
from shardq.worker.stats import Stats
from tests.helpers import job_factory, job_row, sql, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed_job_factory():
    """claimed_job_factory(n) -> n jobs claimed (CLAIMED, nothing counted) by
    one worker that holds every shard, as ``ClaimedJob``s; and the store."""
    ensure_shards()
    worker = str(uuid.uuid4())
    store = WorkerStore(application_name="shardq-test-start")
    store.register_worker(worker, "test", 1, [])
    store.claim_shards(worker, 64, 30.0, 64, 3)

    def make(count: int, **job_options) -> list[ClaimedJob]:
        ids = job_factory(count, shard=lambda i: i % 64, **job_options)
        rows = store.claim_jobs(worker, list(range(64)), None, count, count, row_factory=ClaimedJob)
        assert sorted(job.id for job in rows) == sorted(ids)
        return rows

    make.store = store  # type: ignore[attr-defined]
    make.worker = worker  # type: ignore[attr-defined]
    yield make
    store.close()


@pytest.fixture
def starts(claimed_job_factory):
    """The start writes of that worker, on a connection of their own."""
    store = WorkerStore(application_name="shardq-test-starter")
    yield StartWrites(store, Stats(), claimed_job_factory.worker)
    store.close()


def test_a_claimed_job_reads_claimed_with_nothing_counted_until_its_thread_starts_it(claimed_job_factory, starts):
    [job] = claimed_job_factory(1)
    row = job_row(job.id)
    assert (row["status"], row["attempts"], row["started_at"], row["worker_ids"]) == ("CLAIMED", 0, None, [])

    assert starts.start(job) == (STARTED, None)
    row = job_row(job.id)
    assert (row["status"], row["attempts"], row["worker_ids"]) == ("RUNNING", 1, [claimed_job_factory.worker])
    assert row["started_at"] is not None and job.started and job.attempts == 1


def test_threads_that_begin_while_a_start_write_is_in_flight_share_the_next_one(
    claimed_job_factory, starts, second_connection
):
    jobs = claimed_job_factory(5)
    stats = starts.stats
    # The first write waits on this lock; four threads begin meanwhile.
    second_connection.execute("BEGIN")
    second_connection.execute("SELECT 1 FROM shardq_job WHERE id = %s FOR UPDATE", [jobs[0].id])
    verdicts: dict[int, tuple] = {}

    def begin(job: ClaimedJob) -> None:
        verdicts[job.id] = starts.start(job)

    first = threading.Thread(target=begin, args=(jobs[0],))
    first.start()
    wait_until(
        lambda: sql("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'") != [(0,)],
        message="the first start write to wait for the row lock",
    )
    others = [threading.Thread(target=begin, args=(job,)) for job in jobs[1:]]
    for thread in others:
        thread.start()
    wait_until(lambda: len(starts._asked) == 4, message="four threads to wait for the next write")
    second_connection.execute("ROLLBACK")
    for thread in [first, *others]:
        thread.join(timeout=30)
    assert all(verdict == (STARTED, None) for verdict in verdicts.values()) and len(verdicts) == 5
    # One statement for the first thread, one for the four that began together.
    assert (stats["start_writes"], stats["started"]) == (2, 5)
    assert sql("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING' AND attempts = 1") == [(5,)]


def test_a_start_whose_claim_was_superseded_is_lost_and_writes_nothing(claimed_job_factory, starts):
    [job] = claimed_job_factory(1)
    # A takeover moved the job on (its fence is no longer the shard's version).
    sql("UPDATE shardq_shard SET claim_version = nextval('shardq_claim_version_seq') WHERE shard = %s", [job.shard])
    assert starts.start(job) == (LOST, None)
    row = job_row(job.id)
    assert (row["status"], row["attempts"], row["worker_ids"]) == ("CLAIMED", 0, [])


def test_the_start_write_reuses_one_cursor_and_a_new_connection_gets_a_new_one(claimed_job_factory, starts):
    first, second, third = claimed_job_factory(3)
    store = starts.store
    assert starts.start(first) == (STARTED, None)
    kept = store._kept
    assert kept is not None and not kept.closed
    assert starts.start(second) == (STARTED, None)
    assert store._kept is kept, "the second start write built a cursor of its own"
    # The rows still come back by name, from the kept cursor's tuples.
    assert (second.attempts, second.status_rank) == (1, job_row(second.id)["status_rank"])

    # Its connection dies: the write on it fails (a verdict), and the next
    # one opens a connection and a cursor on that.
    sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'shardq-test-starter' AND datname = current_database()"
    )
    assert starts.start(third)[0] == UNAVAILABLE
    third.start_verdict = None  # begun again (the executor hands it back; a later claim brings it)
    assert starts.start(third) == (STARTED, None)
    assert store._kept is not kept and store._kept.connection is store.conn
    assert job_row(third.id)["status"] == "RUNNING"


@pytest.mark.parametrize("threads", [2, 5, 8])
def test_threads_beginning_back_to_back_each_get_their_own_start_once(claimed_job_factory, starts, threads):
    """The hand-over between groups (each waiting thread on a lock of its
    own; the first of the gathered group writes it): however the threads
    interleave, every job gets one verdict, STARTED, written once, and no
    thread is left waiting (joined with a timeout)."""
    per_thread = 12
    jobs = claimed_job_factory(threads * per_thread)
    verdicts: dict[int, list[tuple]] = {job.id: [] for job in jobs}

    def begin(mine: list[ClaimedJob]) -> None:
        for job in mine:
            verdicts[job.id].append(starts.start(job))

    workers = [threading.Thread(target=begin, args=(jobs[n::threads],)) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in workers), "a thread was left waiting for its start"
    assert all(seen == [(STARTED, None)] for seen in verdicts.values()), verdicts
    stats = starts.stats
    assert stats["started"] == len(jobs) and 1 <= stats["start_writes"] <= len(jobs)
    assert not starts._writing and not starts._asked and not starts._waiters
    assert sql("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING' AND attempts = 1") == [(len(jobs),)]


@pytest.mark.parametrize("arriving", [3, 2])
def test_a_start_write_gathers_the_threads_still_in_short_tasks_until_the_last_asks_or_its_time_is_up(
    claimed_job_factory, arriving
):
    """The writing thread waits (``Gather.seconds()``) for the other
    threads not asleep for work (``Gather.others()``: three here) to ask
    too: when the last of them asks it writes at once, one statement for
    all; when one never comes, it writes those that came once its time is
    up. The first thread asks alone, the others a moment later, as threads
    leaving no-op tasks do."""
    import time

    from shardq.worker.starter import Gather

    store = WorkerStore(application_name="shardq-test-gather")
    wait = 10.0 if arriving == 3 else 1.5
    starts = StartWrites(store, Stats(), claimed_job_factory.worker, gather=Gather(lambda: wait, lambda: 3))
    jobs = claimed_job_factory(1 + arriving)
    verdicts: dict[int, tuple] = {}

    def begin(job: ClaimedJob) -> None:
        verdicts[job.id] = starts.start(job)

    began = time.monotonic()
    first = threading.Thread(target=begin, args=(jobs[0],))
    first.start()
    wait_until(lambda: starts._gathering is not None, message="the first thread to gather")
    others = [threading.Thread(target=begin, args=(job,)) for job in jobs[1:]]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(timeout=30)
    elapsed = time.monotonic() - began
    store.close()
    assert all(verdict == (STARTED, None) for verdict in verdicts.values()) and len(verdicts) == 1 + arriving
    assert (starts.stats["start_writes"], starts.stats["started"]) == (1, 1 + arriving)
    if arriving == 3:
        assert elapsed < wait, f"the last thread's ask did not end the wait ({elapsed:.2f} s)"
    else:
        assert elapsed >= wait, "the write went before its time was up with a thread missing"
    assert not starts._writing and starts._gathering is None
