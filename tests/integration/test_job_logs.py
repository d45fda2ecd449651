"""Per-job logs (shardq/worker/joblogs.py): what a task logs during its
attempt is kept with that attempt, bounded, redacted, and written with the
attempt's outcome; other threads', shardq's own and later records are not."""

import html
import logging
import re

import pytest

from shardq.worker.joblogs import CAPTURE
from tests.helpers import job_row, stepped_worker, wait_until
from tests.taskapp import joblog_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)


def logs_of(result) -> list[dict]:
    return job_row(result.id)["logs"] or []


def test_a_tasks_info_lines_are_kept_with_its_attempt_redacted_and_its_debug_lines_are_not(stepped):
    result = joblog_tasks.chatty.enqueue(["first line", "second line"], password="hunter2-secret")

    [outcome] = stepped.step()
    assert outcome.status == "SUCCESSFUL"
    [entry] = logs_of(result)
    assert entry["attempt"] == 1
    lines = entry["text"].split("\n")
    # Timestamped, levelled, the logger named; INFO kept under a root at WARNING.
    assert [line.split(" ", 2)[2] for line in lines] == [
        "INFO tests.taskapp.joblog_tasks: first line",
        "INFO tests.taskapp.joblog_tasks: second line",
        "INFO tests.taskapp.joblog_tasks: logging in with [redacted]",
        "WARNING tests.taskapp.joblog_tasks: a warning of the task",
    ]
    assert "hunter2-secret" not in str(job_row(result.id)["logs"])


def test_each_attempt_of_a_retried_job_keeps_its_own_log(stepped):
    result = joblog_tasks.logs_then_fails.enqueue(2, 10)

    outcomes = [o for _ in range(3) for o in stepped.step()]
    assert [o.status for o in outcomes] == ["READY", "READY", "SUCCESSFUL"]
    entries = logs_of(result)
    assert [e["attempt"] for e in entries] == [1, 2, 3]
    for n, entry in enumerate(entries, start=1):
        assert entry["text"].endswith(f"attempt {n}: " + "x" * 10), entry
        assert f"attempt {n + 1}" not in entry["text"]


def test_a_task_with_log_false_keeps_nothing(stepped):
    result = joblog_tasks.quiet.enqueue("top secret")
    assert [o.status for o in stepped.step()] == ["SUCCESSFUL"]
    assert job_row(result.id)["logs"] is None


def test_a_task_that_logs_nothing_writes_no_log(stepped):
    result = tasks.noop.enqueue()
    [outcome] = stepped.step()
    assert outcome.log_json is None
    assert job_row(result.id)["logs"] is None


def test_odd_records_are_stored_safely_and_other_threads_and_shardqs_own_lines_are_not_attached(stepped):
    result = joblog_tasks.odd_records.enqueue()
    [outcome] = stepped.step()
    assert outcome.status == "SUCCESSFUL", job_row(result.id)["errors"]
    [entry] = logs_of(result)
    text = entry["text"]
    assert "could not be formatted (TypeError" in text and "'%d apples'" in text
    assert "nul \\x00 inside" in text
    assert "surrogate \\ud800 and \\udfff here" in text
    assert "emoji 🚀 and é" in text
    assert "a shardq line" not in text
    assert "from another thread" not in text
    assert text.endswith("the task's last line")


def test_a_huge_message_is_cut_at_the_bound_and_the_cut_is_marked(settings):
    settings.SHARDQ = {**settings.SHARDQ, "JOB_LOG_BYTES": 1000}
    with stepped_worker(concurrency=1) as stepped:
        result = joblog_tasks.huge.enqueue(5000)  # "é" is two bytes of UTF-8
        [outcome] = stepped.step()
    assert outcome.status == "SUCCESSFUL"
    [entry] = logs_of(result)
    text = entry["text"]
    assert len(text.encode("utf-8")) <= 1000
    head, mark = text.rsplit("\n… ", 1)
    cut = int(mark.removesuffix(" bytes cut"))
    # What was logged, less what is kept, is what the mark says was cut.
    logged = len(f"INFO tests.taskapp.joblog_tasks: {'é' * 5000}\n".encode()) + len(
        b"INFO tests.taskapp.joblog_tasks: after the huge one"
    )
    timestamps = 2 * len(b"2026-01-01 00:00:00,000 ")
    assert cut == logged + timestamps - len(head.encode("utf-8"))


def test_the_attempts_of_a_job_together_keep_within_the_bound_the_oldest_giving_way(settings):
    settings.SHARDQ = {**settings.SHARDQ, "JOB_LOG_BYTES": 1000}
    with stepped_worker(concurrency=1) as stepped:
        result = joblog_tasks.logs_then_fails.enqueue(2, 400)
        statuses = [o.status for _ in range(3) for o in stepped.step()]
    assert statuses == ["READY", "READY", "SUCCESSFUL"]
    entries = logs_of(result)
    assert [e["attempt"] for e in entries] == [1, 2, 3]
    assert sum(len(e["text"].encode()) for e in entries) <= 1000
    # The newest two fit; the first gave way to a mark of its size.
    assert entries[0]["text"].startswith("… ") and entries[0]["text"].endswith(" bytes cut")
    assert [e["text"].endswith("x" * 400) for e in entries[1:]] == [True, True]


def test_an_async_tasks_lines_and_its_child_tasks_are_kept(stepped):
    result = joblog_tasks.async_logs.enqueue(7)
    [outcome] = stepped.step()
    assert outcome.status == "SUCCESSFUL"
    [entry] = logs_of(result)
    assert [line.split(": ", 1)[1] for line in entry["text"].split("\n")] == ["async line 7", "from a child task 7"]


def test_a_record_logged_after_the_attempt_ended_is_not_attached(stepped):
    joblog_tasks.LATE_LOGGED.clear()
    result = joblog_tasks.async_leaves_a_logger.enqueue()
    [outcome] = stepped.step()
    assert outcome.status == "SUCCESSFUL"
    wait_until(joblog_tasks.LATE_LOGGED.is_set, timeout=10, message="the late line")
    [entry] = logs_of(result)
    assert entry["text"].endswith("returning now")
    assert "after the attempt ended" not in entry["text"]


def test_the_root_level_and_the_projects_handlers_are_restored_when_the_worker_stops():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    filters = {id(h): list(h.filters) for h in handlers}
    with stepped_worker(concurrency=1) as stepped:
        stepped.run(0)  # starts the executor, which installs the capture
        assert CAPTURE.handler in root.handlers
    assert root.level == level
    assert root.handlers == handlers
    assert {id(h): list(h.filters) for h in handlers} == filters


def test_an_attempt_that_timed_out_keeps_what_it_logged_until_its_deadline(stepped):
    result = joblog_tasks.logs_then_hangs.enqueue()
    [outcome] = stepped.step()
    assert (outcome.status, outcome.extra.get("timed_out")) == ("FAILED", True)
    [entry] = logs_of(result)
    assert entry["text"].endswith("INFO tests.taskapp.joblog_tasks: before the deadline")


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ([{"attempt": 1, "text": "<i>one</i>"}, {"attempt": 2, "text": "two"}], ["Attempt 1", "<i>one</i>", "two"]),
        ({"not": "an array"}, ['{"not": "an array"}']),
        (["a bare string", 7], ["a bare string", "7"]),
        ([{"attempt": 1, "text": "x" * 70_000}], ["… (70000 bytes)"]),
    ],
)
def test_the_job_page_shows_each_attempts_log_and_odd_rows_as_they_are(admin_client, stored, shown):
    import json

    from tests.helpers import job_factory, sql

    [job_id] = job_factory()
    sql("UPDATE shardq_job SET logs = %s::jsonb WHERE id = %s", [json.dumps(stored), job_id])
    page = admin_client.get(f"/admin/shardq/job/{job_id}/change/").content.decode()
    section = page[page.index("field-logs_display") : page.index("</fieldset>", page.index("field-logs_display"))]
    for text in shown:
        assert text in html.unescape(section), (text, section)
    assert "<i>one</i>" not in page, "the text is escaped"


def test_the_job_page_says_none_when_nothing_was_logged(admin_client):
    from tests.helpers import job_factory

    [job_id] = job_factory()
    page = admin_client.get(f"/admin/shardq/job/{job_id}/change/").content.decode()
    section = page[page.index("field-logs_display") :]
    assert re.search(r'<div class="readonly">none</div>', section)
