"""Live queue controls (shardq/queues.py, docs/operations.md "Queue
controls"): a paused queue's jobs are not claimed, its claimed jobs not
started go back, enqueue still works, the state outlives the worker, and a
concurrency override bounds the jobs of a queue each worker holds; in the
fast tier, on stepped and in-process workers."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

import shardq
from shardq import queues
from tests.helpers import scalar, sql, stepped_worker, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def statuses(ids) -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM shardq_job WHERE id = ANY(%s) GROUP BY status", [list(ids)]))


def enqueue(task, n):
    return [
        int(r.id)
        for r in shardq.enqueue_many(task, [((i, 1), {}) if task is tasks.add else ((), {}) for i in range(n)])
    ]


def test_a_paused_queue_is_not_claimed_enqueue_still_works_and_resume_lets_it_run(stepped):
    assert queues.pause("reports", by="test") is True
    assert queues.pause("reports") is False, "pausing a paused queue changes nothing"
    reports = enqueue(tasks.add, 5)  # enqueue into a paused queue works
    default = enqueue(tasks.noop, 5)

    outcomes = stepped.drain()
    assert sorted(o.id for o in outcomes) == sorted(default)
    assert statuses(reports) == {"READY": 5}, "a paused queue's jobs stay READY"

    assert queues.resume("reports") is True
    stepped.worker.fetcher.controls.notified("")  # what the NOTIFY does on the listener's thread
    outcomes = stepped.drain()
    assert sorted(o.id for o in outcomes) == sorted(reports)
    assert statuses(reports) == {"SUCCESSFUL": 5}


def test_the_pause_outlives_the_worker_a_new_worker_reads_it_before_its_first_claim():
    queues.pause("reports")
    reports = enqueue(tasks.add, 3)
    with stepped_worker(concurrency=2) as first:
        assert first.claim() == []
    with stepped_worker(concurrency=2) as restarted:
        assert restarted.claim() == [], "the restarted worker must not claim a paused queue"
        assert statuses(reports) == {"READY": 3}
        queues.resume("reports")
        restarted.worker.fetcher.controls.notified("")
        assert sorted(j.id for j in restarted.claim(3)) == sorted(reports)


def test_pausing_hands_back_the_claimed_jobs_not_started_and_running_ones_finish(stepped):
    reports = enqueue(tasks.add, 6)
    claimed = stepped.claim(6)
    assert sorted(j.id for j in claimed) == sorted(reports)
    assert statuses(reports) == {"CLAIMED": 6}

    queues.pause("reports")
    stepped.worker.fetcher.controls.notified("")
    assert stepped.claim() == []
    assert stepped.worker.buffer.buffered == 0, "the paused queue's buffered jobs left the buffer"
    handback = stepped.worker.handback
    while handback.pending:
        handback.flush_once(block=False)
    assert statuses(reports) == {"READY": 6}, "handed back READY, not started"
    assert scalar("SELECT max(attempts) FROM shardq_job WHERE id = ANY(%s)", [reports]) == 0


def test_a_concurrency_override_bounds_the_jobs_of_a_queue_a_worker_holds_and_others_fill_the_rest():
    queues.set_concurrency("reports", 2)
    reports = enqueue(tasks.add, 8)
    default = enqueue(tasks.noop, 4)
    with stepped_worker(concurrency=16) as worker:
        claimed = worker.claim()
        by_queue: dict[str, int] = {}
        for job in claimed:
            by_queue[job.queue_name] = by_queue.get(job.queue_name, 0) + 1
        assert by_queue.get("reports") == 2, by_queue
        # A second claim while two are held brings none of that queue.
        more = worker.claim()
        assert not [j for j in more if j.queue_name == "reports"]
        assert sorted(j.id for j in claimed + more if j.queue_name == "default") == sorted(default)
        handback = worker.worker.handback
        while handback.pending:
            handback.flush_once(block=False)
        assert statuses(reports).get("CLAIMED", 0) == 2
        # Every job still runs, two of the queue at a time.
        outcomes = worker.run(len(claimed + more))
        worker.write()
        outcomes += worker.drain()
        assert {o.id for o in outcomes} >= set(reports)
        assert statuses(reports) == {"SUCCESSFUL": 8}
        # Cleared: the whole backlog may be claimed at once again.
        queues.set_concurrency("reports", None)
        more_reports = enqueue(tasks.add, 6)
        worker.worker.fetcher.controls.notified("")
        assert len(worker.claim(6)) == 6, more_reports


def test_a_running_worker_obeys_a_pause_through_its_notify_not_its_poll(settings):
    # The poll would take a minute: only the NOTIFY can make it in time.
    settings.SHARDQ = {**settings.SHARDQ, "POLL_INTERVAL": 60.0}
    from tests.helpers import in_process_worker

    with in_process_worker(concurrency=2) as worker:
        controls = worker.fetcher.controls
        wait_until(lambda: controls.loads >= 1, timeout=30, message="the first read of the controls")
        queues.pause("reports")
        wait_until(lambda: controls.paused == {"reports"}, timeout=30, message="the pause to reach the worker")
        reports = enqueue(tasks.add, 3)
        default = enqueue(tasks.noop, 3)
        wait_until(lambda: statuses(default) == {"SUCCESSFUL": 3}, timeout=60, message="the other queue to run")
        assert statuses(reports) == {"READY": 3}
        queues.resume("reports")
        wait_until(lambda: statuses(reports) == {"SUCCESSFUL": 3}, timeout=60, message="the resumed queue to run")


def test_the_command_pauses_resumes_sets_and_lists_and_status_shows_it():
    out = io.StringIO()
    call_command("shardq_queue", "pause", "reports", stdout=out)
    call_command("shardq_queue", "concurrency", "emails", "3", stdout=out)
    assert "queue reports paused" in out.getvalue()
    assert "at most 3 jobs on each worker" in out.getvalue()
    listed = io.StringIO()
    call_command("shardq_queue", "list", "--json", stdout=listed)
    rows = {row["queue"]: row for row in json.loads(listed.getvalue())}
    assert (rows["reports"]["paused"], rows["reports"]["concurrency"]) == (True, None)
    assert (rows["emails"]["paused"], rows["emails"]["concurrency"]) == (False, 3)
    assert rows["default"]["paused"] is False and rows["default"]["updated_at"] is None
    assert rows["reports"]["updated_by"].startswith("shell")

    status = io.StringIO()
    call_command("shardq_status", stdout=status)
    assert "queue reports: paused" in status.getvalue()
    assert "queue emails: running, at most 3 per worker" in status.getvalue()
    status_json = io.StringIO()
    call_command("shardq_status", "--json", stdout=status_json)
    controls = {c["queue"]: c for c in json.loads(status_json.getvalue())["queue_controls"]}
    assert controls["reports"]["paused"] is True and controls["emails"]["concurrency"] == 3

    call_command("shardq_queue", "resume", "reports", stdout=out)
    call_command("shardq_queue", "concurrency", "emails", "none", stdout=out)
    assert "concurrency override cleared" in out.getvalue()
    assert queues.queue_states(configured=[]) and not any(
        s.paused or s.concurrency for s in queues.queue_states(configured=[])
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["concurrency", "reports", "0"], "--n must be a whole number from 1"),
        (["concurrency", "reports", "many"], "or none"),
        (["pause", ""], "non-empty str"),
    ],
)
def test_the_command_refuses_bad_input_naming_it(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("shardq_queue", *argv, stdout=io.StringIO(), stderr=io.StringIO())


def test_the_python_api_refuses_bad_input_naming_it():
    with pytest.raises(ValueError, match="int >= 1"):
        queues.set_concurrency("reports", 0)
    with pytest.raises(ValueError, match="int >= 1"):
        queues.set_concurrency("reports", True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue name"):
        queues.pause(None)  # type: ignore[arg-type]


def test_the_metrics_export_the_controls_and_zero_a_queue_no_longer_controlled():
    import prometheus_client

    from shardq.worker.metrics import Metrics

    registry = prometheus_client.CollectorRegistry()
    metrics = Metrics(registry, multiprocess=False)
    metrics.queue_control_sample([("reports", True, None), ("emails", False, 4)])
    assert registry.get_sample_value("shardq_queue_paused", {"queue": "reports"}) == 1
    assert registry.get_sample_value("shardq_queue_concurrency_override", {"queue": "emails"}) == 4
    metrics.queue_control_sample([])
    assert registry.get_sample_value("shardq_queue_paused", {"queue": "reports"}) == 0
    assert registry.get_sample_value("shardq_queue_concurrency_override", {"queue": "emails"}) == 0
