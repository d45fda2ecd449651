"""Per-job logs from a real worker process under Django's default LOGGING
(root at WARNING, no handler of the project's): a task's INFO lines are kept
with its attempt, yet the worker prints what it printed before the feature,
the task's WARNING through logging's last resort and no INFO line of the
task. (docs/configuration.md, "Per-job logs".)"""

from tests.helpers import job_row, wait_until
from tests.taskapp import joblog_tasks

DEFAULT_LOGGING = {"DJANGO_SETTINGS_MODULE": "tests.isolation.default_logging_settings"}


def test_under_djangos_default_logging_info_lines_are_kept_and_the_worker_prints_no_more(workers):
    worker = workers.start("--concurrency", "2", env=DEFAULT_LOGGING)
    result = joblog_tasks.chatty.enqueue(["shown on the job page"], password="pw-never-printed")

    def finished():
        row = job_row(result.id)
        return row["status"] == "SUCCESSFUL" and row

    row = wait_until(finished, timeout=60, message="the chatty job")
    [entry] = row["logs"]
    assert "INFO tests.taskapp.joblog_tasks: shown on the job page" in entry["text"]
    assert "WARNING tests.taskapp.joblog_tasks: a warning of the task" in entry["text"]
    workers.stop_all()
    printed = workers.log(worker)
    # Logging's last resort prints the bare message of a WARNING, as it did.
    assert "\na warning of the task\n" in printed
    assert "shown on the job page" not in printed
    assert "pw-never-printed" not in printed
