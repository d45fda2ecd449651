"""The worker's stages stepped in this process (tests/helpers.py
``SteppedWorker``): a claim, the executors' runs and the completer's write
each happen when the test says, and the test awaits them through the
pipeline's test signals (shardq/worker/testsignal.py), never by sleeping.
Between steps the table shows exactly what each stage has done."""

import threading

import pytest

import shardq
from shardq.worker.testsignal import PipelineSignals, TestSignal
from tests.helpers import job_row, sql, stepped_worker
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def statuses(ids) -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM shardq_job WHERE id = ANY(%s) GROUP BY status", [list(ids)]))


def test_a_claim_buffers_jobs_claimed_a_run_starts_them_and_only_the_write_makes_them_successful(stepped):
    ids = [int(r.id) for r in shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(6)])]

    claimed = stepped.claim(6)
    assert sorted(job.id for job in claimed) == sorted(ids)
    assert statuses(ids) == {"CLAIMED": 6}, "claimed is not started"

    outcomes = stepped.run(6)
    assert {(o.id, o.status, o.return_value_json) for o in outcomes} == {
        (job_id, "SUCCESSFUL", str(i + 1)) for i, job_id in enumerate(ids)
    }
    # Each job was started by its thread's start write, one group per
    # threads that began together (two threads: groups of one or two).
    started = [job_id for group in stepped.signals.started.taken() for job_id in group]
    assert sorted(started) == sorted(ids)
    # An outcome is written by a later start write it rode on, or waits in
    # the completer: the table shows the rest running. None counts as
    # written (landed) before the completer's step made it durable.
    seen = statuses(ids)
    assert set(seen) <= {"RUNNING", "SUCCESSFUL"} and sum(seen.values()) == 6, seen
    assert stepped.worker.stats["succeeded"] == 0 and stepped.worker.completer.pending == 6

    written = stepped.write()
    assert written == {(o.id, o.rank) for o in outcomes}
    assert statuses(ids) == {"SUCCESSFUL": 6}
    assert [job_row(i)["attempts"] for i in ids] == [1] * 6
    assert stepped.claim() == [], "nothing is left to claim"


def test_a_failing_job_is_written_ready_for_its_retry_and_the_next_step_runs_it_again(stepped):
    result = tasks.flaky.enqueue(1, "stepped")  # fails its first attempt, then returns

    [first] = stepped.step()
    assert (first.status, first.attempts) == ("READY", 1)
    row = job_row(result.id)
    assert (row["status"], row["attempts"], len(row["errors"])) == ("READY", 1, 1)

    [second] = stepped.step()  # the backoff of tasks.flaky is 0 s: due at once
    assert (second.status, second.attempts) == ("SUCCESSFUL", 2)
    result.refresh()
    assert result.status == "SUCCESSFUL"


def test_jobs_past_the_buffer_wait_in_the_table_until_a_later_claim_takes_them():
    with stepped_worker(concurrency=1, prefetch=4) as stepped:
        ids = [int(r.id) for r in shardq.enqueue_many(tasks.noop, [((), {})] * 30)]
        outcomes = stepped.drain()
        assert sorted(o.id for o in outcomes) == sorted(ids)
        assert statuses(ids) == {"SUCCESSFUL": 30}
        # More than one claim: the demand (one thread, a look-ahead of at
        # most 4) never buffers 30 at once.
        assert stepped.worker.stats["claim_statements"] >= 3


def test_a_signal_nobody_listens_to_records_nothing_and_one_initialised_hands_values_on_in_order():
    signal: TestSignal[int] = TestSignal()
    signal.signal(1)  # production: no queue, nothing kept
    with pytest.raises(RuntimeError, match="never initialised"):
        signal.wait(0.01)

    signal.init()
    threading.Thread(target=lambda: [signal.signal(n) for n in (2, 3)]).start()
    assert [signal.wait(5), signal.wait(5)] == [2, 3]
    with pytest.raises(AssertionError, match="no test signal within"):
        signal.wait(0.01)
    signal.signal(4)
    with pytest.raises(AssertionError, match=r"not empty: \[4\]"):
        signal.require_empty()


def test_a_worker_is_built_with_its_signals_off():
    from shardq.worker.runtime import Worker

    worker = Worker()
    assert isinstance(worker.pipeline.signals, PipelineSignals)
    for name in ("claimed", "started", "finished", "written"):
        assert getattr(worker.pipeline.signals, name)._queue is None, name
    for store in worker.store.values():
        store.close()
