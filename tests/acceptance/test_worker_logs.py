"""What a real worker prints with Django's default logging (a project that
never configured LOGGING, DEBUG False): its start, its shard changes, every
failed job, the signal and its stop, each a line with a time, on stderr."""

import os
import re
import signal
import socket

import pytest

import shardq
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import scalar, status_counts, worker_id_of

DEFAULT_LOGGING = {"DJANGO_SETTINGS_MODULE": "tests.isolation.default_logging_settings"}
# logging's asctime, then the level: every line the worker prints of its own.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) \[\d+\] shardq[.\w]*: ")


@pytest.fixture
def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lines_with(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


def stop(workers, proc) -> str:
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, workers.log(proc)
    return workers.log(proc)


def test_a_worker_logs_its_start_failed_jobs_signal_and_stop_with_djangos_default_logging(workers):
    proc = workers.start("--concurrency", "2", "--worker-id", "logs-1", env=DEFAULT_LOGGING)
    worker = worker_id_of(proc.pid)
    failed = tasks.fail.enqueue("the card was declined")
    retried = tasks.flaky.enqueue(1, "logs")
    wait_until(lambda: status_counts() == {"FAILED": 1, "SUCCESSFUL": 1}, timeout=60, message=status_counts)

    log = stop(workers, proc)

    assert lines_with(log, f"worker logs-1 ({worker}) started (pid {proc.pid}, concurrency 2, queues all, pool "), log
    assert ", 64 shards, lease TTL 2s)" in lines_with(log, "started (pid")[0]
    (claimed,) = lines_with(log, "claimed 64 shard(s) 0-63; holding 64 (share 64, 1 live worker(s) in pool")
    (failure,) = lines_with(log, f"job {failed.id} ")
    assert failure.endswith(
        f"ERROR [{proc.pid}] shardq.worker.executor: job {failed.id} (tests.taskapp.tasks.fail) failed: "
        "ValueError: the card was declined; attempt 1 of 1, no retry left: FAILED"
    ), failure
    (retry,) = lines_with(log, f"job {retried.id} ")
    assert (
        f"WARNING [{proc.pid}] shardq.worker.executor: job {retried.id} (tests.taskapp.tasks.flaky) failed: "
        "RuntimeError: attempt 1 fails on purpose; attempt 1 of 3, retrying in 0.0s"
    ) in retry
    assert lines_with(log, "SIGTERM: finishing running jobs (grace 30s), then releasing leases"), log
    assert lines_with(log, f"worker logs-1 ({worker}) stopped: released 64 shards"), log
    for line in (claimed, failure, retry):
        assert LINE.match(line), line
    assert "Traceback" not in log, log


def test_shard_changes_are_one_line_each_claim_release_and_takeover(workers):
    first = workers.start("--concurrency", "1", env=DEFAULT_LOGGING)
    first_id = worker_id_of(first.pid)
    wait_until(lambda: lines_with(workers.log(first), "claimed 64 shard(s)"), timeout=30, message="the first claim")
    second = workers.start("--concurrency", "1", env=DEFAULT_LOGGING)
    second_id = worker_id_of(second.pid)
    wait_until(
        lambda: (
            lines_with(workers.log(first), "released 32 shard(s) 32-63 to the pool's other workers; holding 32")
            and lines_with(workers.log(second), "claimed 32 shard(s) 32-63; holding 32 (share 32, 2 live worker(s)")
        ),
        timeout=60,
        message=lambda: f"the split into 32/32 in the logs:\n{workers.log(first)}\n{workers.log(second)}",
    )
    shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(20)])  # jobs on the second's shards to rescue or not
    os.killpg(second.pid, signal.SIGKILL)
    second.wait(timeout=30)

    # The survivor sees the dead worker's sessions gone (dead-owner
    # detection: one WARNING naming it) and takes its shards over at once,
    # in one line.
    wait_until(
        lambda: lines_with(
            workers.log(first), "claimed 32 shard(s) 32-63 (took over the dead worker(s) lease(s) of 32-63: "
        ),
        timeout=60,
        message=lambda: f"the takeover in the log:\n{workers.log(first)}",
    )
    assert scalar("SELECT count(*) FROM shardq_shard WHERE owner = %s", [first_id]) == 64
    [dead] = lines_with(workers.log(first), second_id)
    assert "WARNING" in dead and "gone from the database (the process died)" in dead, dead
    stop(workers, first)


def test_an_unreachable_database_at_start_is_one_line_and_exit_1(workers, closed_port):
    url = f"postgres://nobody@127.0.0.1:{closed_port}/nodb"
    proc = workers.start("--concurrency", "1", env={**DEFAULT_LOGGING, "DATABASE_URL": url})

    assert proc.wait(timeout=60) == 1
    log = workers.log(proc)
    assert log.count("\n") == 1, log
    assert re.search(
        rf"ERROR \[{proc.pid}\] shardq.worker: worker \S+ cannot start: cannot connect to PostgreSQL: .*"
        rf"port {closed_port} failed: Connection refused Is the server running",
        log,
    ), log


def test_the_traceback_of_an_unreachable_database_is_logged_at_debug(workers, closed_port):
    url = f"postgres://nobody@127.0.0.1:{closed_port}/nodb"
    proc = workers.start("--concurrency", "1", env={"DATABASE_URL": url, "SHARDQ_LOG_LEVEL": "DEBUG"})

    assert proc.wait(timeout=60) == 1
    log = workers.log(proc)
    assert "cannot start: cannot connect to PostgreSQL" in log and "Traceback (most recent call last)" in log, log
