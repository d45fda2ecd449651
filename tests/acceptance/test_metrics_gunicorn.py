"""Enqueue-side metrics under gunicorn (issue 28 §4): with
PROMETHEUS_MULTIPROC_DIR set, the example project's /metrics/ view serves
the enqueues counted by every gunicorn worker, those a worker counted
before it was recycled included; a directory that does not exist is
refused before a worker serves anything."""

import glob
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import requests

from tests.helpers import wait_until
from tests.workers import ROOT, database_url, kill_tree

pytestmark = [pytest.mark.timeout(180), pytest.mark.django_db(transaction=True)]

TOKEN = "scrape-me"
ENQUEUED = re.compile(
    r'^shardq_jobs_enqueued_total\{queue="reports",task="example_project\.demo\.tasks\.add"\} (\S+)$', re.M
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(tmp_path, multiproc_dir, port, *extra) -> tuple[subprocess.Popen, object]:
    out = tmp_path / "gunicorn.out"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "example_project.wsgi", "--bind", f"127.0.0.1:{port}", *extra],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": database_url(),
                # Set where the server starts, as prometheus_client asks.
                "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
                "SHARDQ_ENQUEUE_METRICS": "true",
                "METRICS_TOKEN": TOKEN,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, out


def stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(timeout=30)


def test_every_gunicorn_worker_s_enqueues_are_counted_in_the_merged_metrics(tmp_path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    port = free_port()
    # 2 workers, each recycled after 3 requests: 12 enqueues land in at least 4 processes.
    proc, out = start_gunicorn(tmp_path, directory, port, "--workers", "2", "--max-requests", "3")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: up(base), timeout=60, message=lambda: out.read_text())
        for i in range(12):
            response = requests.post(f"{base}/add/", json={"a": i, "b": 1}, timeout=30)
            assert response.status_code == 201, response.text
        assert requests.get(f"{base}/metrics/", timeout=30).status_code == 403  # the access rule
        scraped = requests.get(f"{base}/metrics/", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert scraped.status_code == 200, scraped.text
    finally:
        stop(proc)
    assert float(ENQUEUED.search(scraped.text)[1]) == 12, scraped.text
    counted_by = {re.search(r"_(\d+)\.db$", p)[1] for p in glob.glob(str(directory / "counter_*.db"))}
    assert len(counted_by) >= 4, counted_by


def test_a_multiprocess_directory_that_does_not_exist_stops_gunicorn_with_the_reason(tmp_path):
    proc, out = start_gunicorn(tmp_path, tmp_path / "missing", free_port(), "--workers", "2")
    try:
        assert proc.wait(timeout=120) != 0
    finally:
        stop(proc)
    assert "missing' is not a directory: create it (empty) before the server starts" in out.read_text()


def up(base: str) -> bool:
    try:
        return requests.get(f"{base}/metrics/", timeout=30).status_code == 403
    except requests.ConnectionError:  # not listening yet
        return False
