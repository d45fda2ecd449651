"""``make demo``'s command: a summary, then the admin served with a login it
printed until Ctrl-C; with DEMO_EXIT=1 it stops at once. Either way every
process it started is stopped."""

import os
import re
import signal
import subprocess
import sys

import pytest
import requests

from tests.helpers import sql, wait_until
from tests.workers import POOL_TAG, ROOT, alive, database_url, kill_tree, tagged

pytestmark = [pytest.mark.timeout(300), pytest.mark.process]


def start_demo(tmp_path, **env) -> tuple[subprocess.Popen, object]:
    out = tmp_path / "demo.out"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "shardq_demo", "--orders", "20", "--processes", "1", "--concurrency", "2"],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": database_url(),
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                # Inherited by its gunicorn and workers: stop_demo finds them by it.
                POOL_TAG: str(tmp_path),
                **env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: Ctrl-C reaches it as a terminal's would
        )
    return proc, out


def stop_demo(proc, tmp_path) -> None:
    """SIGKILL a demo still running and whatever it started that is left: its
    gunicorn and workers lead sessions of their own, which a kill of its group
    misses, and outlive a demo that died (left behind, they hold connections
    to the test database, whose drop then fails the session)."""
    if proc.poll() is None:
        kill_tree(proc.pid)
        proc.wait(timeout=30)
    for pid in tagged(str(tmp_path)):
        kill_tree(pid)


def exit_code(proc, out, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the demo did not exit within {timeout} s:\n{out.read_text()}")


def test_the_demo_serves_the_admin_with_the_login_it_printed_until_ctrl_c(transactional_db, tmp_path):
    proc, out = start_demo(tmp_path)
    try:
        printed = wait_until(
            lambda: re.search(r"admin: (http://127\.0\.0\.1:\d+)/admin/\S*\s+login: admin / (\S+)", out.read_text()),
            timeout=240,
            interval=0.2,
            message=lambda: f"the admin URL and login (exit {proc.poll()}):\n{out.read_text()}",
        )
        base, password = printed[1], printed[2]
        gunicorn = int(re.search(r"gunicorn on \S+ \(pid (\d+)\)", out.read_text())[1])
        with requests.Session() as browser:
            browser.get(f"{base}/admin/login/", timeout=30)
            page = browser.post(
                f"{base}/admin/login/?next=/admin/shardq/job/",
                data={"username": "admin", "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
                timeout=30,
            )
            assert page.status_code == 200 and page.url == f"{base}/admin/shardq/job/", page.url
            assert page.headers["X-Frame-Options"] == "DENY"
            assert browser.get(f"{base}/static/admin/css/base.css", timeout=30).status_code == 200
            assert proc.poll() is None, "the demo stopped while serving"

        os.killpg(proc.pid, signal.SIGINT)

        assert exit_code(proc, out, timeout=90) == 0, out.read_text()
        assert "everything it started is stopped" in out.read_text()
        wait_until(lambda: not alive(gunicorn), timeout=30, message="gunicorn to be gone")
    finally:
        stop_demo(proc, tmp_path)


def test_demo_exit_stops_after_the_summary(transactional_db, tmp_path):
    proc, out = start_demo(tmp_path, DEMO_EXIT="1")
    try:
        assert exit_code(proc, out, timeout=240) == 0, out.read_text()
    finally:
        stop_demo(proc, tmp_path)
    text = out.read_text()
    assert "who did what" in text and "DEMO_EXIT is set: stopping now" in text
    assert "login:" not in text
    # The order workflow, step by step: every step succeeded, the order closed.
    steps = re.findall(
        r"^\s+(charge_card|pack_items|send_receipt|ship_order|close_order)\s+(\w+)\s+started", text, re.M
    )
    assert sorted(steps) == sorted(
        (name, "SUCCESSFUL") for name in ("charge_card", "pack_items", "send_receipt", "ship_order", "close_order")
    ), text
    order = [name for name, _ in steps]
    assert order[0] == "charge_card" and order[-1] == "close_order"
    assert re.search(r"status 'closed' \(rank 4\)", text), text
    # Two tenants, one queue: the quiet tenant's reports, enqueued after the
    # noisy tenant's 2,000, all ran while most of the noisy backlog waited.
    flat = " ".join(text.split())
    tenants = re.search(
        r"noisy tenant globex: 2000 reports enqueued, (\d+) still waiting; quiet tenant acme: 20 reports", flat
    )
    assert tenants and int(tenants[1]) > 1000, flat
    # The durable backfill: its worker process was kill -9ed mid-walk, the
    # next owner resumed it, and each order has exactly one audit.
    assert re.search(r"kill -9 of worker pid \d+ after \d+ batches", text), text
    done = re.search(r"backfill SUCCESSFUL: (\d+) batches; (\d+) audits for (\d+) orders", text)
    assert done and done[2] == done[3] == "21", text


def test_a_ctrl_c_while_the_backfill_walks_hands_it_back_with_its_cursor(transactional_db, tmp_path):
    from example_project.demo.models import OrderAudit

    # Slow batches and no kill: the Ctrl-C lands between batches.
    proc, out = start_demo(tmp_path, DEMO_BACKFILL_PAUSE="3", DEMO_BACKFILL_KILL_AT="1000")
    try:
        wait_until(lambda: "auditing 21 orders" in out.read_text(), timeout=240, interval=0.2, message=out.read_text)
        wait_until(lambda: OrderAudit.objects.exists(), timeout=60, message="a first batch")

        os.killpg(proc.pid, signal.SIGINT)

        assert exit_code(proc, out, timeout=90) == 0, out.read_text()
    finally:
        stop_demo(proc, tmp_path)
    text = out.read_text()
    assert "Ctrl-C: stopping the workers" in text and "everything it started is stopped" in text, text
    [(job_id, status, attempts)] = sql(
        "SELECT id, status, attempts FROM shardq_job WHERE task_path = 'example_project.demo.tasks.backfill_audits'"
    )
    [(batches,)] = sql("SELECT batches FROM shardq_job_step WHERE job_id = %s AND kind = 'iterate'", [job_id])
    # Handed back at a boundary: READY, no attempt used, its cursor kept, and
    # exactly the committed batches' audits (3 orders a batch).
    assert (status, attempts) == ("READY", 0), text
    assert 1 <= batches < 7 and OrderAudit.objects.count() == 3 * batches
    assert f"backfill job {job_id} left READY after {batches} batches" in text, text
