"""Metrics: flags, the enqueuing process's counters, label bounds, the cluster lock."""

import glob
import os
import socket
import subprocess
import sys
import tempfile

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from prometheus_client import CollectorRegistry

import shardq
from shardq.db.store import WorkerStore
from shardq.worker import metrics
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import ROOT

T = "tests.taskapp.tasks."


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http", "80.5"])
def test_a_metrics_port_out_of_range_is_a_command_error(port):
    with pytest.raises(CommandError, match="--metrics-port must be a whole number from 1 to 65535"):
        call_command("shardq_worker", "--metrics-port", port)


@pytest.mark.parametrize("port", ["9100", 0, 70000, True, 91.0])
def test_a_bad_metrics_port_setting_is_a_command_error(port):
    with (
        override_settings(SHARDQ={**settings.SHARDQ, "METRICS_PORT": port}),
        pytest.raises(CommandError, match=r"SHARDQ\['METRICS_PORT'\] must be a port number from 1 to 65535"),
    ):
        call_command("shardq_worker")


# The command checks shardq's tables before it binds the port: the test
# database must be set up even when this is the first test of an xdist worker.
@pytest.mark.django_db
@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_metrics_port_in_use_is_a_command_error_before_anything_starts(processes, tmp_path, monkeypatch):
    # A temp dir of the test's own: another test or run on this machine may
    # make and remove shardq-metrics-* directories in the shared one meanwhile.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    directories = set(glob.glob(os.path.join(tempfile.gettempdir(), "shardq-metrics-*")))
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"--metrics-port {port}: the port is in use by another process"):
            call_command("shardq_worker", "--metrics-port", str(port), "--processes", processes)
    # Nothing left behind: no directory, the process's prometheus settings as they were.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "shardq-metrics-*"))) == directories
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


@pytest.fixture
def counting():
    """This process's metrics on, in a registry of the test's own."""
    registry = CollectorRegistry()
    metrics.disable()
    metrics.enable(registry=registry)
    yield registry
    metrics.disable()


@pytest.mark.django_db
def test_the_enqueuing_process_counts_enqueues_and_cancels(counting):
    results = [tasks.noop.enqueue() for _ in range(3)]
    shardq.enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
    shardq.cancel(results[0], reason="not needed")
    shardq.cancel(results[0])  # already finished: nothing more
    enqueued = "shardq_jobs_enqueued_total"
    assert counting.get_sample_value(enqueued, {"queue": "default", "task": T + "noop"}) == 3
    assert counting.get_sample_value(enqueued, {"queue": "reports", "task": T + "add"}) == 2
    finished = {"queue": "default", "task": T + "noop", "outcome": "cancelled"}
    assert counting.get_sample_value("shardq_jobs_finished_total", finished) == 1


def test_label_values_are_bounded():
    guard = metrics.LabelGuard(frozenset({"default", "emails"}))
    assert guard.queue("emails") == "emails"
    assert guard.queue("attacker-queue-1") == "other"  # not a configured queue
    assert guard.task(T + "noop") == T + "noop"
    assert guard.task("os.system") == "other"  # not a defined task
    any_queue = metrics.LabelGuard(None, limit=3)  # TASKS allows any queue name
    assert [any_queue.queue(f"q{i}") for i in range(5)] == ["q0", "q1", "q2", "other", "other"]
    assert any_queue.queue("q1") == "q1"


def test_a_flood_of_queue_names_costs_bounded_series_and_memory():
    registry = CollectorRegistry()
    m = metrics.Metrics(registry, multiprocess=False)
    m.guard = metrics.LabelGuard(None, limit=5)
    for i in range(metrics.MAX_CACHED_PAIRS + 100):
        m.children(f"flood-{i}", T + "noop").enqueued.inc()
    series = {
        tuple(sorted(sample.labels.items()))
        for family in registry.collect()
        if family.name == "shardq_jobs_enqueued"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert len(series) == 6  # five names, then "other"
    assert registry.get_sample_value("shardq_jobs_enqueued_total", {"queue": "other", "task": T + "noop"}) == 100 + (
        metrics.MAX_CACHED_PAIRS - 5
    )
    assert len(m._children) <= metrics.MAX_CACHED_PAIRS + 6


@pytest.mark.django_db(transaction=True)
def test_one_worker_at_a_time_holds_the_cluster_metrics_lock():
    first, second = WorkerStore(application_name="m1"), WorkerStore(application_name="m2")
    try:
        assert first.metrics_lock() is True
        assert first.metrics_lock() is True  # kept, not stacked
        assert second.metrics_lock() is False
        first.close()  # the holder's session ends (a dead worker): the next one asking takes over
        wait_until(second.metrics_lock, timeout=10, message="the lock to pass once the session has ended")
        assert first.metrics_lock() is False
    finally:
        first.close()
        second.close()


def test_a_worker_that_stops_computing_the_cluster_gauges_exports_zeros():
    registry = CollectorRegistry()
    m = metrics.Metrics(registry, multiprocess=False)
    rows = [
        {"queue_name": "default", "status": "READY", "jobs": 7, "oldest_due_seconds": 12.5},
        {"queue_name": "emails", "status": "RUNNING", "jobs": 2, "oldest_due_seconds": None},
    ]
    m.cluster_sample(rows, unowned=3)
    assert registry.get_sample_value("shardq_jobs", {"queue": "default", "state": "READY"}) == 7
    assert registry.get_sample_value("shardq_oldest_ready_age_seconds", {"queue": "default"}) == 12.5
    assert registry.get_sample_value("shardq_oldest_ready_age_seconds", {"queue": "emails"}) == 0
    assert registry.get_sample_value("shardq_shards_unowned") == 3
    assert registry.get_sample_value("shardq_cluster_metrics_holder") == 1
    m.cluster_sample(rows[1:], unowned=0)  # the default queue drained
    assert registry.get_sample_value("shardq_jobs", {"queue": "default", "state": "READY"}) == 0
    m.cluster_sample(None)  # another worker holds the lock now
    assert registry.get_sample_value("shardq_jobs", {"queue": "emails", "state": "RUNNING"}) == 0
    assert registry.get_sample_value("shardq_cluster_metrics_holder") == 0


@pytest.mark.process
def test_metrics_off_imports_no_prometheus_client():
    code = (
        "import sys, django; django.setup();"
        "import shardq.backend, shardq.worker.runtime, shardq.management.commands.shardq_worker;"
        "from shardq.worker import metrics; assert metrics.active is None;"
        "assert 'prometheus_client' not in sys.modules, 'imported'"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_view_at_the_path_the_docs_give_serves_prometheus_text():
    from django.test import RequestFactory

    from shardq.metrics import metrics_view  # docs/operations.md's import, kept beside shardq.worker.metrics

    response = metrics_view(RequestFactory().get("/metrics"))

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert b"python_info" in response.content  # prometheus_client's default registry
