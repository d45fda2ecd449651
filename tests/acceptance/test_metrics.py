"""``shardq_worker --metrics-port``: real worker processes, scraped over HTTP."""

import glob
import os
import signal
import socket
import urllib.request
from datetime import timedelta

from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import shardq
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import status_counts

T = "tests.taskapp.tasks."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels) -> float:
    """A sample's value, 0 when absent; labels not given are summed over."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def enqueue_the_mix() -> dict[str, int]:
    """Jobs whose every outcome is known; returns the attempts each task makes."""
    shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(20)])
    shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(10)])
    shardq.enqueue_many(tasks.fail, [(("on purpose",), {}) for _ in range(3)])
    tasks.flaky.enqueue(1, "once-a")  # fails once, then succeeds: 1 retried, 1 succeeded
    tasks.flaky.enqueue(1, "once-b")
    tasks.flaky.enqueue(5, "always")  # max_attempts 3: 2 retried, then dead
    later = timezone.now() + timedelta(hours=1)
    shardq.enqueue_many(tasks.noop.using(run_after=later), [((), {}) for _ in range(4)])  # stay READY
    return {"noop": 20, "add": 10, "fail": 3, "flaky": 7}


def check_the_mix(samples, attempts: dict[str, int], group: bool = False) -> None:
    """``group``: two processes share the shards; a job buffered (CLAIMED)
    in one when its shard moves to the other is handed back and claimed
    again there, run once: claims may then exceed attempts, starts may not."""
    for name, n in attempts.items():
        assert value(samples, "shardq_jobs_started_total", task=T + name) == n, name
        assert value(samples, "shardq_job_duration_seconds_count", task=T + name) == n, name
        assert value(samples, "shardq_job_wait_seconds_count", task=T + name) == n, name
    finished = "shardq_jobs_finished_total"
    assert value(samples, finished, task=T + "noop", queue="default", outcome="succeeded") == 20
    assert value(samples, finished, task=T + "add", queue="reports", outcome="succeeded") == 10
    assert value(samples, finished, task=T + "fail", outcome="failed") == 3
    assert value(samples, finished, task=T + "flaky", outcome="succeeded") == 2
    assert value(samples, finished, task=T + "flaky", outcome="retried") == 4
    assert value(samples, finished, task=T + "flaky", outcome="dead") == 1
    assert value(samples, finished) == 20 + 10 + 3 + 7
    assert value(samples, "shardq_fence_rejections_total") == 0
    # Every job claimed once per attempt (and once more for a hand-back, see
    # ``group``), in batches the histogram counts.
    claimed = value(samples, "shardq_claim_batch_size_sum")
    assert claimed == 20 + 10 + 3 + 7 if not group else 20 + 10 + 3 + 7 <= claimed <= 2 * (20 + 10 + 3 + 7)
    assert value(samples, "shardq_claim_duration_seconds_count") == value(samples, "shardq_claim_batch_size_count")
    # No label carries an id, a key or an argument.
    labels = {name for (n, ls) in samples if n.startswith("shardq_") for name, _ in ls}
    assert labels <= {"queue", "task", "outcome", "state", "le"}, labels


def test_a_worker_serves_metrics_that_match_the_jobs_it_ran(workers):
    attempts = enqueue_the_mix()
    port = free_port()
    proc = workers.start("--metrics-port", str(port), "--concurrency", "3")
    wait_until(
        lambda: status_counts() == {"SUCCESSFUL": 32, "FAILED": 4, "READY": 4},
        timeout=90,
        message=lambda: f"the jobs to finish (now {status_counts()})\n{workers.log(proc)}",
    )
    # Written outcomes are counted once their batch is written; the cluster
    # gauges once a heartbeat (0.4 s here).
    samples = wait_until(
        lambda: (
            (s := scrape(port))
            and value(s, "shardq_jobs_finished_total") == 40
            # Starts and run times are added once a second (Metrics.flush).
            and value(s, "shardq_jobs_started_total") == 40
            and value(s, "shardq_job_duration_seconds_count") == 40
            and value(s, "shardq_cluster_metrics_holder") == 1
            and value(s, "shardq_worker_shards_owned") == 64
            and value(s, "shardq_jobs") == 4
            and s
        ),
        timeout=30,
        message="the counters and gauges to catch up",
    )
    check_the_mix(samples, attempts)
    assert value(samples, "shardq_worker_slots") == 3
    assert value(samples, "shardq_jobs", queue="default", state="READY") == 4  # the deferred ones
    assert value(samples, "shardq_jobs", state="RUNNING") == 0
    assert value(samples, "shardq_oldest_ready_age_seconds", queue="default") == 0  # none is due
    assert value(samples, "shardq_shards_unowned") == 0
    proc.terminate()
    proc.wait(timeout=60)


def test_processes_share_one_port_that_reports_the_group(workers, tmp_path):
    attempts = enqueue_the_mix()
    port = free_port()
    # The supervisor's temp dir is the test's own: other tests and runs on
    # this machine make and remove shardq-metrics-* directories in the shared one.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = workers.start("--metrics-port", str(port), "--processes", "2", "--concurrency", "2", env={"TMPDIR": tmpdir})
    wait_until(
        lambda: status_counts() == {"SUCCESSFUL": 32, "FAILED": 4, "READY": 4},
        timeout=90,
        message=lambda: f"the jobs to finish (now {status_counts()})\n{workers.log(proc)}",
    )
    samples = wait_until(
        lambda: (
            (s := scrape(port))
            and value(s, "shardq_jobs_finished_total") == 40
            # Starts and run times are added once a second (Metrics.flush).
            and value(s, "shardq_jobs_started_total") == 40
            and value(s, "shardq_job_duration_seconds_count") == 40
            and value(s, "shardq_worker_shards_owned") == 64
            and value(s, "shardq_cluster_metrics_holder") == 1
            and value(s, "shardq_jobs") == 4
            and s
        ),
        timeout=30,
        message="the group's counters and gauges",
    )
    check_the_mix(samples, attempts, group=True)
    assert len(glob.glob(str(tmpdir / "shardq-metrics-*"))) == 1  # the group's PROMETHEUS_MULTIPROC_DIR
    assert value(samples, "shardq_worker_slots") == 4  # 2 processes x 2 threads, summed
    assert value(samples, "shardq_jobs", queue="default", state="READY") == 4  # one holder, not two
    # A child killed and restarted: its counters stay in the group's totals,
    # its live gauges go with it.
    child = workers.children(proc)[0]
    os.kill(child, signal.SIGKILL)  # a crash: the supervisor restarts it
    wait_until(lambda: len(workers.children(proc)) == 2 and child not in workers.children(proc), timeout=30)
    samples = wait_until(
        lambda: (s := scrape(port)) and value(s, "shardq_worker_slots") == 4 and s,
        timeout=30,
        message="the restarted child's gauges",
    )
    assert value(samples, "shardq_jobs_finished_total") == 40
    proc.terminate()
    assert proc.wait(timeout=60) == 0
    # The supervisor's PROMETHEUS_MULTIPROC_DIR goes with it.
    assert glob.glob(str(tmpdir / "shardq-metrics-*")) == []
