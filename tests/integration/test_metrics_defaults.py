"""Metrics safe by default (issue 28 §4): the worker's port binds this host
only unless told otherwise, enqueue-side counting has a switch of its own,
and a PROMETHEUS_MULTIPROC_DIR this process would not write to is refused
rather than silently missing its counts (gunicorn itself:
tests/acceptance/test_metrics_gunicorn.py)."""

import socket

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError
from django.test import RequestFactory, override_settings
from prometheus_client import CollectorRegistry

from shardq.management.commands.shardq_worker import metrics_address, serve_metrics
from shardq.worker import metrics
from tests.taskapp import tasks

T = "tests.taskapp.tasks."


def shardq_settings(**keys):
    return override_settings(SHARDQ={**settings.SHARDQ, **keys})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_metrics_port_binds_the_loopback_interface_unless_told_otherwise():
    assert metrics_address(None) == "127.0.0.1"
    endpoint, directory = serve_metrics(free_port(), multiprocess=False, address=metrics_address(None))
    try:
        assert directory is None
        assert endpoint.server.server_address[0] == "127.0.0.1"
    finally:
        endpoint.close()
    with shardq_settings(METRICS_ADDRESS="0.0.0.0"):
        assert metrics_address(None) == "0.0.0.0"
        assert metrics_address("::1") == "::1"  # the flag wins over the setting
        endpoint, _ = serve_metrics(free_port(), multiprocess=False, address=metrics_address(None))
        try:
            assert endpoint.server.server_address[0] == "0.0.0.0"
        finally:
            endpoint.close()


@pytest.mark.parametrize("value", ["localhost", "0.0.0.0:9108", "", "every"])
def test_a_metrics_address_that_is_not_an_ip_address_is_a_command_error(value):
    with pytest.raises(CommandError, match=r"--metrics-address must be an IP address .* 127\.0\.0\.1 \(the default"):
        metrics_address(value)
    with (
        shardq_settings(METRICS_ADDRESS=value),
        pytest.raises(CommandError, match=r"SHARDQ\['METRICS_ADDRESS'\] must be an IP address"),
    ):
        metrics_address(None)


def test_enqueue_side_counting_follows_its_own_switch_and_else_the_metrics_port():
    cases = [
        ({}, False),
        ({"METRICS_PORT": 9108}, True),
        ({"ENQUEUE_METRICS": True}, True),  # a web process: no port, still counted
        ({"METRICS_PORT": 9108, "ENQUEUE_METRICS": False}, False),  # a worker that should not
    ]
    for keys, counted in cases:
        with shardq_settings(**{"METRICS_PORT": None, "ENQUEUE_METRICS": None, **keys}):
            assert metrics.counts_enqueues() is counted, keys
    with shardq_settings(ENQUEUE_METRICS="yes"), pytest.raises(ImproperlyConfigured, match="ENQUEUE_METRICS"):
        metrics.counts_enqueues()


@pytest.fixture
def fresh_metrics():
    metrics.disable()
    yield
    metrics.disable()


@pytest.mark.django_db
@pytest.mark.parametrize("switch", [True, None, False])
def test_a_process_with_metrics_on_counts_its_enqueues_and_cancels_unless_switched_off(fresh_metrics, switch):
    registry = CollectorRegistry()
    with shardq_settings(METRICS_PORT=9108, ENQUEUE_METRICS=switch):
        metrics.enable(registry=registry)
        result = tasks.noop.enqueue()
        tasks.noop.get_backend().cancel([result.id])
    labels = {"queue": "default", "task": T + "noop"}
    enqueued = registry.get_sample_value("shardq_jobs_enqueued_total", labels)
    cancelled = registry.get_sample_value("shardq_jobs_finished_total", {**labels, "outcome": "cancelled"})
    assert (enqueued, cancelled) == ((None, None) if switch is False else (1, 1))


def test_a_multiprocess_directory_that_does_not_exist_is_refused(fresh_metrics, monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match=r"PROMETHEUS_MULTIPROC_DIR=.*missing' is not a directory"):
        metrics.enable(registry=CollectorRegistry())
    assert metrics.active is None


def test_a_multiprocess_directory_set_after_prometheus_client_was_imported_is_refused(
    fresh_metrics, monkeypatch, tmp_path
):
    # This process imported prometheus_client with the variable unset: its
    # values live in memory, which the view's merge of the directory misses.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(ImproperlyConfigured, match="prometheus_client was imported before it was"):
        metrics.enable(registry=CollectorRegistry())
    with pytest.raises(ImproperlyConfigured, match="prometheus_client was imported before it was"):
        metrics.metrics_view(RequestFactory().get("/metrics"))


@pytest.mark.django_db
def test_the_example_project_s_metrics_view_takes_a_scraper_s_token_or_a_staff_user(client, django_user_model):
    with override_settings(METRICS_TOKEN="s3cret"):
        assert client.get("/metrics/").status_code == 403
        assert client.get("/metrics/", headers={"Authorization": "Bearer wrong"}).status_code == 403
        scraped = client.get("/metrics/", headers={"Authorization": "Bearer s3cret"})
        assert scraped.status_code == 200 and b"python_info" in scraped.content
        client.force_login(django_user_model.objects.create_user("ops", is_staff=True))
        assert client.get("/metrics/").status_code == 200
    with override_settings(METRICS_TOKEN=""):
        client.logout()
        assert client.get("/metrics/", headers={"Authorization": "Bearer "}).status_code == 403
