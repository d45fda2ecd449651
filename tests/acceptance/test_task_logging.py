"""Django's task log records from real worker processes (issue 13, item 1).

With Django's default logging (no LOGGING setting) and DEBUG = False, the
``django.tasks`` logger is enabled at INFO but every handler drops an INFO
record; the worker then builds no record (and no TaskResult) for a job that
succeeds. A failure's ERROR record does reach a handler (``mail_admins``) and
is still built, with the exception. Where a project's logging does emit INFO
records (its own LOGGING, or DEBUG = True), every job logs both lines.
"""

import re

import shardq
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import status_counts, wait_drained

DEFAULT_LOGGING = {"DJANGO_SETTINGS_MODULE": "tests.isolation.default_logging_settings"}
COUNTED = {"SHARDQ_TEST_COUNT_LOG_RECORDS": "1"}
JOBS = 200
FAILURES = 3


def run_jobs() -> tuple[list, list]:
    """JOBS no-op jobs and FAILURES failing ones, run to the end."""
    ok = shardq.enqueue_many(tasks.noop, [((), {})] * JOBS)
    failed = shardq.enqueue_many(tasks.fail, [((f"boom {n}",), {}) for n in range(FAILURES)])
    wait_drained(JOBS + FAILURES)
    assert status_counts() == {"SUCCESSFUL": JOBS, "FAILED": FAILURES}
    return ok, failed


def records_in(worker) -> dict:
    """What the worker's ``log_records`` task reports (a job run after the others)."""
    result = tasks.log_records.enqueue()
    wait_until(lambda: (result.refresh(), result.is_finished)[1], timeout=60, message="the log_records job")
    assert result.status == "SUCCESSFUL", result.errors
    return result.return_value


def test_with_djangos_default_logging_a_successful_job_creates_no_log_record(workers):
    worker = workers.start("--concurrency", "2", env={**DEFAULT_LOGGING, **COUNTED})
    run_jobs()
    counts = records_in(worker)
    # Only the failures' ERROR records, each with its exception (what
    # mail_admins would send); nothing at INFO for the 200 + 3 starts and the
    # 200 successes.
    assert counts == {"ERROR": FAILURES, "with exc_info": FAILURES}, counts


def test_with_djangos_default_logging_and_debug_every_job_logs_both_lines(workers):
    worker = workers.start("--concurrency", "2", env={**DEFAULT_LOGGING, **COUNTED, "DJANGO_DEBUG": "1"})
    ok, failed = run_jobs()
    counts = records_in(worker)
    # Started and finished for every job, plus the log_records job's start.
    assert counts == {"INFO": 2 * JOBS + FAILURES + 1, "ERROR": FAILURES, "with exc_info": FAILURES}, counts
    assert_logged(workers.log(worker), ok, failed)


def test_with_info_logging_configured_every_job_logs_both_lines_and_failures_their_traceback(workers):
    # The test settings' LOGGING, with django.tasks at INFO: records reach the
    # root logger's console handler.
    worker = workers.start("--concurrency", "2", env={**COUNTED, "SHARDQ_TASK_LOG_LEVEL": "INFO"})
    ok, failed = run_jobs()
    counts = records_in(worker)
    assert counts == {"INFO": 2 * JOBS + FAILURES + 1, "ERROR": FAILURES, "with exc_info": FAILURES}, counts
    assert_logged(workers.log(worker), ok, failed)


def assert_logged(log: str, ok: list, failed: list) -> None:
    """Django's receivers' lines: RUNNING and the final state for every job,
    the traceback after each failure's line."""
    states: dict[str, list[str]] = {}
    for job_id, state in re.findall(r"Task id=(\d+) path=\S+ state=(\w+)", log):
        states.setdefault(job_id, []).append(state)
    for result in ok:
        assert states.get(result.id) == ["RUNNING", "SUCCESSFUL"], (result.id, states.get(result.id))
    for n, result in enumerate(failed):
        assert states.get(result.id) == ["RUNNING", "FAILED"], (result.id, states.get(result.id))
        assert re.search(
            rf"Task id={result.id} path=\S+ state=FAILED\nTraceback .*?ValueError: boom {n}\n", log, re.DOTALL
        ), log[-3000:]
