"""Durable long jobs (shardq/durable.py) on an in-process worker: steps recorded
once, iterations whose batches commit exactly once with their cursor,
interruptions that hand the job back without using an attempt, suspensions
that free the thread and wake at their time or on a signal."""

import time

import pytest
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

import shardq
from tests.helpers import in_process_worker, job_row, scalar, sql, wait_until
from tests.taskapp import durable_tasks, tasks
from tests.taskapp.models import Item, ItemLedger, StepRun

pytestmark = pytest.mark.django_db(transaction=True)


def shardq_result(result):
    """The job's TaskResult as Django's API reads it now."""
    return result.task.get_result(result.id)


def status(result) -> str:
    return job_row(result.id)["status"]


def finished(result) -> bool:
    return status(result) in ("SUCCESSFUL", "FAILED")


def steps_ran(result) -> dict[str, int]:
    runs: dict[str, int] = {}
    for name in StepRun.objects.filter(job_id=int(result.id)).values_list("name", flat=True):
        runs[name] = runs.get(name, 0) + 1
    return runs


def cursor_row(result) -> dict:
    [row] = sql(
        "SELECT batches, total, done, output FROM shardq_job_step WHERE job_id = %s AND kind = 'iterate'",
        [int(result.id)],
    )
    return {"batches": row[0], "total": row[1], "done": row[2], "output": row[3]}


def make_items(tenant: int, n: int) -> None:
    Item.objects.bulk_create(Item(tenant=tenant, n=i) for i in range(n))


def ledger_counts(result) -> dict[int, int]:
    counts: dict[int, int] = {}
    for item_id in ItemLedger.objects.filter(job_id=int(result.id)).values_list("item_id", flat=True):
        counts[item_id] = counts.get(item_id, 0) + 1
    return counts


# -- steps ----------------------------------------------------------------------------


def test_steps_before_a_failure_run_once_across_retries():
    result = durable_tasks.three_steps.enqueue(fail_times=2)
    with in_process_worker(concurrency=2):
        wait_until(lambda: finished(result), timeout=60, message="the job to finish")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    # The recorded outputs come back as JSON, the same on every run.
    assert result.return_value == [{"n": 1}, [2], 3]
    assert len(result.errors) == 2 and job_row(result.id)["attempts"] == 3
    assert steps_ran(result) == {"one": 1, "two": 1, "three": 1}


def test_a_step_recorded_after_the_fence_moved_on_is_refused():
    result = durable_tasks.late_step.enqueue()
    with in_process_worker(concurrency=1) as worker:
        wait_until(lambda: worker.stats["fence_rejections"] >= 1, timeout=60)
    # Its function ran (at least once), but nothing of the zombie's is recorded
    # and no outcome written: the job waits for the shard's next owner.
    assert steps_ran(result) == {"late": 1}
    assert scalar("SELECT count(*) FROM shardq_job_step WHERE job_id = %s", [int(result.id)]) == 0
    assert status(result) == "RUNNING"


def test_two_steps_of_one_name_in_one_run_are_an_error():
    result = durable_tasks.twice_named.enqueue()
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "shardq.exceptions.DuplicateStep"
    assert "'same' is used twice in one run" in result.errors[-1].traceback
    assert steps_ran(result) == {"same": 1}


def test_a_durable_call_in_an_async_task_fails_the_job_saying_to_declare_it_with_def():
    result = durable_tasks.async_stepper.enqueue()
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60, message="the job to finish")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "shardq.exceptions.DurableNeedsSyncTask"
    assert "tests.taskapp.durable_tasks.async_stepper is an `async def` task" in error.traceback
    assert "Declare the task with `def`" in error.traceback


# -- iterations -------------------------------------------------------------------------


def test_an_iteration_walks_every_item_once_by_keyset():
    make_items(1, 95)
    make_items(2, 7)  # another tenant's: not in the walk
    result = durable_tasks.backfill.enqueue(tenant=1, size=10)
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"items": 95, "batches_this_run": 10}
    counts = ledger_counts(result)
    assert sorted(counts) == list(Item.objects.filter(tenant=1).order_by("pk").values_list("pk", flat=True))
    assert set(counts.values()) == {1}
    cursor = cursor_row(result)
    assert (cursor["batches"], cursor["total"], cursor["done"]) == (10, 95, True)


def test_a_batch_whose_fence_moved_on_rolls_back_and_the_next_owner_resumes_after_the_last_commit():
    make_items(1, 60)
    result = durable_tasks.backfill.enqueue(tenant=1, size=10, bump_at=3)
    with in_process_worker(concurrency=1) as worker:
        # Batch 3's cursor write finds the fence moved on: FenceLost, and the
        # batch's ledger rows roll back with it.
        wait_until(lambda: worker.stats["fence_rejections"] >= 1, timeout=60)
        assert ItemLedger.objects.filter(job_id=int(result.id)).count() == 20
        assert cursor_row(result)["batches"] == 2
        assert status(result) == "RUNNING"
    # The next owner's takeover rescues the interrupted attempt; the job
    # resumes after batch 2 and ends with every item in the ledger once.
    sql("UPDATE shardq_job SET kwargs = kwargs - 'bump_at' WHERE id = %s", [int(result.id)])
    # (The lease whose version moved on is the "other worker's": let it lapse
    # rather than wait out its TTL.)
    sql("UPDATE shardq_shard SET lease_expires = clock_timestamp() - interval '1 hour' WHERE owner IS NOT NULL")
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"items": 60, "batches_this_run": 4}
    counts = ledger_counts(result)
    assert len(counts) == 60 and set(counts.values()) == {1}
    # The step ran on the first run only.
    assert cursor_row(result)["batches"] == 6


def test_the_generic_form_pages_through_a_function_of_the_cursor():
    result = durable_tasks.pages.enqueue(last=10)
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.return_value == list(range(10))
    assert cursor_row(result)["batches"] == 4 and cursor_row(result)["done"] is True


# -- interruption ------------------------------------------------------------------------


def test_a_stopping_worker_hands_an_iterating_job_back_at_the_next_batch_without_using_an_attempt():
    make_items(1, 200)
    result = durable_tasks.backfill.enqueue(tenant=1, size=10, pause=0.1)
    with in_process_worker(concurrency=1) as worker:
        wait_until(lambda: ItemLedger.objects.filter(job_id=int(result.id)).count() >= 30, timeout=60)
    # Stopped (as on SIGTERM) well inside the grace: handed back at once.
    assert worker.stats["handed_back_at_boundary"] == 1
    row = job_row(result.id)
    assert row["status"] == "READY" and row["attempts"] == 0 and row["worker_ids"] == []
    done = cursor_row(result)["batches"]
    assert 3 <= done < 20 and ItemLedger.objects.filter(job_id=int(result.id)).count() == done * 10
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["batches_this_run"] == 20 - done
    counts = ledger_counts(result)
    assert len(counts) == 200 and set(counts.values()) == {1}
    assert job_row(result.id)["attempts"] == 1 == len(job_row(result.id)["worker_ids"])


def test_a_stopping_worker_releases_the_shard_of_a_handed_back_job_while_its_other_jobs_still_run():
    """A rolling deploy: the stopping worker gives the durable job's shard to
    the next owner as soon as the job is handed back, not when the slowest
    of its other jobs ends (within the grace)."""
    make_items(1, 200)
    tasks.GATE.clear()
    slow = tasks.gate.enqueue()
    result = durable_tasks.backfill.enqueue(tenant=1, size=10, pause=0.1)
    while job_row(result.id)["shard"] == job_row(slow.id)["shard"]:
        sql("DELETE FROM shardq_job WHERE id = %s", [int(result.id)])
        result = durable_tasks.backfill.enqueue(tenant=1, size=10, pause=0.1)
    shard = job_row(result.id)["shard"]
    try:
        with in_process_worker(concurrency=2, grace=60) as worker:
            wait_until(lambda: status(slow) == "RUNNING", timeout=60, message="the slow job to run")
            wait_until(lambda: ItemLedger.objects.filter(job_id=int(result.id)).count() >= 20, timeout=60)
            worker.request_stop()
            wait_until(
                lambda: (
                    status(result) == "READY"
                    and scalar("SELECT owner FROM shardq_shard WHERE shard = %s", [shard]) is None
                ),
                timeout=30,
                message="the handed-back job's shard to be released while the slow job runs",
            )
            assert status(slow) == "RUNNING"
            tasks.GATE.set()
    finally:
        tasks.GATE.set()
    assert status(slow) == "SUCCESSFUL"
    assert worker.stats["handed_back_at_boundary"] == 1
    assert job_row(result.id)["attempts"] == 0


def test_a_cancel_stops_an_iterating_job_at_its_next_batch_and_it_stays_cancelled():
    make_items(1, 200)
    result = durable_tasks.backfill.enqueue(tenant=1, size=10, pause=0.1)
    with in_process_worker(concurrency=1) as worker:
        wait_until(lambda: ItemLedger.objects.filter(job_id=int(result.id)).count() >= 20, timeout=60)
        shardq.cancel(result)
        wait_until(lambda: worker.buffer.processing == 0, timeout=30, message="the job's thread to leave it")
        ledger = ItemLedger.objects.filter(job_id=int(result.id)).count()
    row = job_row(result.id)
    assert row["status"] == "FAILED" and row["errors"][-1]["exception_class_path"] == "shardq.exceptions.Cancelled"
    assert ledger < 200 and ledger == cursor_row(result)["batches"] * 10


# -- suspension ------------------------------------------------------------------------------


def test_a_sleeping_job_is_suspended_off_its_thread_and_wakes_at_its_time():
    result = durable_tasks.napper.enqueue(seconds=1.5)
    other = tasks.add.using(queue_name="default").enqueue(2, 3)
    with in_process_worker(concurrency=1) as worker:
        wait_until(lambda: status(result) == "SUSPENDED", timeout=60)
        row = job_row(result.id)
        assert row["attempts"] == 0 and row["worker_ids"] == []
        # Started, not finished: RUNNING to Django.
        assert shardq_result(result).status == TaskResultStatus.RUNNING
        # The one thread is free for other work while it sleeps.
        wait_until(lambda: finished(other), timeout=30)
        assert status(result) == "SUSPENDED"
        until = row["run_after"].timestamp()
        wait_until(lambda: finished(result), timeout=30)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    late = result.return_value["woke"] - until
    print(f"\n[durable] a 1.5 s sleep woke {late * 1000:.0f} ms after its time")
    assert late >= 0
    assert steps_ran(result) == {"before": 1, "after": 1}
    assert worker.stats["suspended"] == 1 and worker.stats["woken"] == 1
    assert job_row(result.id)["attempts"] == 1


def test_a_suspended_job_gives_its_limit_slot_back():
    waiting = durable_tasks.one_at_a_time.enqueue(wait=True)
    with in_process_worker(concurrency=2):
        wait_until(lambda: status(waiting) == "SUSPENDED", timeout=60)
        # The limit allows one at a time: the next job runs only if the
        # suspended one's slot came back.
        other = durable_tasks.one_at_a_time.enqueue(wait=False)
        wait_until(lambda: finished(other), timeout=30, message="the other job to take the freed slot")
        assert status(waiting) == "SUSPENDED"
        shardq.signal(waiting, "go", "went")
        wait_until(lambda: finished(waiting), timeout=30)
    waiting.refresh()
    assert waiting.return_value == "went"


def test_a_signal_wakes_the_job_waiting_for_it_with_its_payload():
    result = durable_tasks.approver.enqueue()
    with in_process_worker(concurrency=1):
        wait_until(lambda: status(result) == "SUSPENDED", timeout=60)
        # No timeout: suspended until the signal comes.
        assert job_row(result.id)["run_after"].year == 9999
        assert shardq.signal(result, "approved", {"user": "ana"}) is True
        wait_until(lambda: finished(result), timeout=30)
    result.refresh()
    assert result.return_value["reply"] == {"user": "ana"}
    assert steps_ran(result) == {"asked": 1}


def test_a_signal_sent_before_the_wait_is_kept_for_it():
    result = durable_tasks.approver.enqueue()
    assert shardq.signal(result.id, "approved", "early") is False
    with in_process_worker(concurrency=1) as worker:
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.return_value["reply"] == "early"
    assert worker.stats["suspended"] == 0
    assert scalar("SELECT consumed_at IS NOT NULL FROM shardq_job_signal WHERE job_id = %s", [int(result.id)])


def test_a_wait_that_times_out_raises_signal_timeout_in_the_task():
    result = durable_tasks.approver.enqueue(timeout=0.5)
    with in_process_worker(concurrency=1):
        wait_until(lambda: finished(result), timeout=60)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value["timed_out"] is True


def test_a_signal_to_a_finished_or_unknown_job_is_refused_clearly():
    done = tasks.add.enqueue(1, 2)
    sql("UPDATE shardq_job SET status = 'SUCCESSFUL' WHERE id = %s", [int(done.id)])
    with pytest.raises(shardq.SignalRefused, match=r"job \d+ has finished \(SUCCESSFUL\)"):
        shardq.signal(done, "approved")
    with pytest.raises(TaskResultDoesNotExist, match="there is no job 999999999"):
        shardq.signal("999999999", "approved")
    with pytest.raises(TypeError, match="payload of signal 'x' is not JSON"):
        shardq.signal(done.id, "x", object())
    assert scalar("SELECT count(*) FROM shardq_job_signal") == 0


@pytest.mark.parametrize("pause", ["sleep", "wait"])
def test_a_suspended_job_of_an_ordered_key_is_not_overtaken_by_the_keys_later_jobs(pause):
    first = durable_tasks.ordered_napper.enqueue(account=7, n=1, pause=pause)
    later = [durable_tasks.ordered_napper.enqueue(account=7, n=n) for n in (2, 3)]
    with in_process_worker(concurrency=4) as worker:
        wait_until(lambda: status(first) == "SUSPENDED", timeout=60, message="the first job to suspend")
        if pause == "wait":
            time.sleep(1.5)  # pacing: the later jobs would run meanwhile without the guard
            shardq.signal(first, "go")
        wait_until(lambda: all(finished(r) for r in [first, *later]), timeout=60, message="the key's jobs to finish")
    assert worker.stats["suspended"] == 1
    order = list(StepRun.objects.filter(job_id__in=[int(r.id) for r in [first, *later]]).order_by("id"))
    assert [run.name for run in order] == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]
    assert all(status(r) == "SUCCESSFUL" for r in [first, *later])


def test_a_suspended_job_can_be_cancelled():
    result = durable_tasks.approver.enqueue()
    with in_process_worker(concurrency=1):
        wait_until(lambda: status(result) == "SUSPENDED", timeout=60)
        assert shardq.cancel(result) == [result.id]
    row = job_row(result.id)
    assert row["status"] == "FAILED"
    assert row["errors"][-1]["traceback"] == "shardq.exceptions.Cancelled: cancelled while suspended\n"


def test_signal_to_resume_pickup_and_sleep_wake_latency():
    """The issue's figures, measured on this machine: a signalled job's
    second run begins within 50 ms at p99 (NOTIFY), a sleep wakes within
    100 ms of its time (the waker). Bounds here are loose (a loaded 2-core
    box); the measured values are printed and recorded in docs/durable.md."""
    waiters = [durable_tasks.approver.enqueue() for _ in range(20)]
    sleepers = [durable_tasks.napper.enqueue(seconds=1.0 + i * 0.05) for i in range(10)]
    with in_process_worker(concurrency=4):
        wait_until(lambda: all(status(w) == "SUSPENDED" for w in waiters), timeout=60)
        sent = {}
        for waiter in waiters:
            sent[waiter.id] = time.time()
            shardq.signal(waiter, "approved", {"n": waiter.id})
            time.sleep(0.05)  # pacing: one signal at a time, as users send them
        wait_until(lambda: all(finished(w) for w in waiters + sleepers), timeout=60)
    pickups = []
    for waiter in waiters:
        waiter.refresh()
        assert waiter.return_value["reply"] == {"n": waiter.id}
        pickups.append(waiter.return_value["woke"] - sent[waiter.id])
    lateness = []
    for sleeper in sleepers:
        sleeper.refresh()
        [until] = sql(
            "SELECT extract(epoch FROM until) FROM shardq_job_step WHERE job_id = %s AND kind = 'sleep'",
            [int(sleeper.id)],
        )[0]
        lateness.append(sleeper.return_value["woke"] - float(until))
    pickups.sort()
    lateness.sort()
    p99 = pickups[min(len(pickups) - 1, round(0.99 * (len(pickups) - 1)))]
    print(
        f"\n[durable] signal -> resume: p50 {pickups[len(pickups) // 2] * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
        f"sleep wake lateness: p50 {lateness[len(lateness) // 2] * 1000:.0f} ms, max {lateness[-1] * 1000:.0f} ms"
    )
    assert p99 < 1.0 and lateness[-1] < 1.0
    assert min(lateness) >= 0


def test_a_sleep_wakes_on_time_with_only_the_poll_fallback(settings):
    """The issue's "with NOTIFY and the poll fallback": with SHARDQ["NOTIFY"]
    off (no listener: what a lost LISTEN connection leaves) a sleep still
    wakes at its time, as the waker's timer, not a notification, wakes it
    and the fetcher is told in-process. Loose bound here (a loaded box);
    the measured lateness is printed and recorded in docs/durable.md."""
    settings.SHARDQ = {**settings.SHARDQ, "NOTIFY": False}
    sleepers = [durable_tasks.napper.enqueue(seconds=1.0 + i * 0.05) for i in range(10)]
    with in_process_worker(concurrency=4) as worker:
        assert worker.listener is None
        wait_until(lambda: all(finished(s) for s in sleepers), timeout=60)
    lateness = []
    for sleeper in sleepers:
        sleeper.refresh()
        [until] = sql(
            "SELECT extract(epoch FROM until) FROM shardq_job_step WHERE job_id = %s AND kind = 'sleep'",
            [int(sleeper.id)],
        )[0]
        lateness.append(sleeper.return_value["woke"] - float(until))
    lateness.sort()
    print(
        f"\n[durable] sleep wake lateness without NOTIFY: p50 {lateness[len(lateness) // 2] * 1000:.0f} ms, "
        f"max {lateness[-1] * 1000:.0f} ms"
    )
    assert lateness[0] >= 0 and lateness[-1] < 1.0
