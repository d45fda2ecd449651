"""Every worker thread is a monitored service (shardq/worker/service.py): one
shape (name, start, stop(deadline), failure), and a service that dies stops
the worker loudly."""

import threading

import pytest

from shardq.worker.service import Service
from tests.helpers import in_process_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def shardq_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("shardq-")}


def test_every_thread_of_a_running_worker_belongs_to_a_monitored_service(settings):
    settings.SHARDQ = {**settings.SHARDQ, "METRICS_PORT": None}
    with in_process_worker(concurrency=2) as worker:
        services = worker.services()
        names = {service.name for service in services}
        assert {"leaser", "fetcher", "listener", "completer", "executor"} <= names
        for service in services:
            assert service.failure is None
            assert callable(service.start) and callable(service.stop)
        # Each thread is one of theirs: a service's own thread, or the
        # executor's pool (its job threads and its async loop).
        running = shardq_threads()
        own = {f"shardq-{name}" for name in names}
        # The leaser's trust-deadline watch: a second thread of the leaser
        # service, its failure recorded in the leaser's (shardq/worker/leaser.py).
        own.add("shardq-leaser-deadline")
        pool = {f"shardq-executor-{n}" for n in range(2)} | {"shardq-async"}
        assert running <= own | pool, running - own - pool
        assert pool <= running
    wait_until(lambda: not shardq_threads(), timeout=10, message=lambda: f"threads to end: {shardq_threads()}")


def test_a_service_that_dies_stops_the_worker_and_names_itself(caplog):
    with in_process_worker(concurrency=1) as worker:
        # A bug in the fetcher's loop: its next round raises.
        def broken():
            raise RuntimeError("a bug in the claim loop")

        worker.fetcher.fetch_once = broken
        worker.fetcher.wake()
        wait_until(lambda: worker.fetcher.failure is not None, timeout=10)
        assert isinstance(worker.fetcher.failure, RuntimeError)
        wait_until(
            lambda: "fetcher stopped unexpectedly: shutting down" in caplog.text,
            timeout=10,
            message=lambda: f"the worker to name the dead service; log: {caplog.text[-2000:]}",
        )


def test_stop_waits_for_the_thread_only_until_its_deadline():
    import time

    class Stubborn(Service):
        name = "stubborn"

        def __init__(self):
            super().__init__()
            self.release = threading.Event()
            self.finished_in_own_thread = None

        def run(self):
            self.release.wait(30)  # ignores interrupt(): a thread stuck in a call

        def finished(self):
            self.finished_in_own_thread = threading.current_thread().name

    service = Stubborn()
    service.start()
    began = time.monotonic()
    service.stop(time.monotonic() + 0.3)
    waited = time.monotonic() - began
    assert 0.25 <= waited < 5, waited
    assert service.alive  # the deadline passed, the thread still runs
    service.release.set()
    wait_until(lambda: not service.alive, timeout=5)
    assert service.finished_in_own_thread == "shardq-stubborn"
    assert service.failure is None
