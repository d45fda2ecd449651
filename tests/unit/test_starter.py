"""The starter's order: started jobs wait best first, and a claim that
outranks them is started out of turn (``Starter.expedite``).

The jobs here arrive started by their claim (``job.started``), so the
starter writes nothing: no database is needed.
"""

from datetime import UTC, datetime

import pytest

from shardq.worker.buffer import Buffer
from shardq.worker.jobs import ClaimedJob
from shardq.worker.starter import Starter
from shardq.worker.stats import Stats

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def claimed(job_id: int, priority: int = 0) -> ClaimedJob:
    """A job its claim started (RUNNING, attempt counted)."""
    return ClaimedJob(
        job_id,
        "tests.taskapp.tasks.noop",
        "default",
        priority,
        0.0,
        job_id % 64,
        None,
        False,
        "[]",
        "{}",
        1,
        1,
        1,
        2,
        EPOCH,
        EPOCH,
        EPOCH,
        "[]",
        "[]",
        0,
        "default",
        started=True,
    )


class Everything:
    """The starter's collaborators that these tests never reach: a lease
    always trusted, nothing handed back."""

    def trusts(self, shard: int, fence: int) -> bool:
        return True

    def return_jobs(self, jobs) -> None:
        raise AssertionError(f"nothing should be handed back: {jobs}")

    def slot_freed(self) -> None:
        pass


@pytest.fixture
def starter():
    """A starter over a real buffer, for one thread and 1 ms tasks: it keeps
    20 jobs started ahead (AHEAD_SECONDS of work) and refills at 10."""
    everything = Everything()
    buffer = Buffer(capacity=100, lanes=4)
    made = Starter(
        None,  # type: ignore[arg-type]  # never reached: the jobs arrive started
        Stats(),
        worker_id="w",
        buffer=buffer,
        leaser=everything,  # type: ignore[arg-type]
        handback=everything,  # type: ignore[arg-type]
        fetcher=everything,  # type: ignore[arg-type]
        concurrency=1,
        task_seconds=lambda: 0.001,
    )
    assert made.wanted() == 20
    yield made
    made.stop()


def take_all(starter: Starter) -> list[int]:
    taken = []
    while (job := starter.take(timeout=0)) is not None:
        taken.append(job.id)
    return taken


def test_started_jobs_are_taken_best_first_and_equals_in_the_order_they_were_started(starter):
    starter.start_jobs([claimed(1, 0), claimed(2, 5), claimed(3, 0)])
    starter.start_jobs([claimed(4, 100), claimed(5, 5), claimed(6, -3)])
    assert starter.lowest_ready() == -3
    assert take_all(starter) == [4, 2, 5, 1, 3, 6]
    assert starter.lowest_ready() is None


def test_a_claim_that_outranks_the_started_jobs_has_its_jobs_started_out_of_turn(starter):
    # 15 started jobs wait: above the refill mark, so no refill would come
    # before a thread has taken 5 of them.
    starter.start_jobs([claimed(n) for n in range(1, 16)])
    starter.start()
    starter.buffer.push_many([claimed(100), claimed(101), claimed(102, 100), claimed(103, 7)])
    starter.expedite(100)
    # Only the jobs that outrank a started one went: the priority-0 ones
    # stay buffered for the refill.
    assert starter.ready == 17
    assert starter.buffer.buffered == 2 and starter.buffer.lowest_priority() == 0
    assert starter.stats["started_out_of_turn"] == 2
    assert [starter.take(timeout=1).id for _ in range(3)] == [102, 103, 1]


def test_a_claim_of_the_same_priority_starts_nothing_out_of_turn(starter):
    starter.start_jobs([claimed(n, 5) for n in range(1, 16)])
    starter.buffer.push_many([claimed(100, 5)])
    starter.expedite(5)
    assert starter.ready == 15 and starter.buffer.buffered == 1
    starter.buffer.push_many([claimed(101, 6)])
    starter.expedite(6)
    # The priority-6 job went; the priority-5 one waits for the refill.
    assert starter.ready == 16 and starter.buffer.buffered == 1
    assert starter.take(timeout=1).id == 101


def test_long_tasks_start_nothing_out_of_turn(starter):
    starter.task_seconds = lambda: 1.0  # no thread idle: wanted() is 0
    starter.start_jobs([claimed(1)])
    starter.buffer.push_many([claimed(100, 100)])
    starter.expedite(100)
    assert starter.ready == 1 and starter.buffer.buffered == 1
    assert starter.stats["started_out_of_turn"] == 0


def test_the_buffer_counts_its_jobs_by_priority_as_they_come_and_go():
    buffer = Buffer(capacity=10, lanes=2)
    assert buffer.lowest_priority() is None
    buffer.push_many([claimed(1, 3), claimed(2, -4), claimed(3, 9)])
    assert buffer.lowest_priority() == -4
    assert [job.id for job in buffer.pop_more(5, min_priority=0)] == [3, 1]
    assert buffer.lowest_priority() == -4
    # A refused duplicate is not counted.
    assert [job.id for job in buffer.push_many([claimed(2, -50)])] == [2]
    assert buffer.lowest_priority() == -4
    assert [job.id for job in buffer.drop_shard(2)] == [2]
    assert buffer.lowest_priority() is None
    buffer.push_many([claimed(4, 1)])
    assert [job.id for job in buffer.drain()] == [4]
    assert buffer.lowest_priority() is None
