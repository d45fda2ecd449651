"""A job's logs on its admin page, in a real browser (docs/admin.md, "A
job's logs"): a job run by a worker's stages in this process, failed once
and retried, shows each attempt's lines in its own monospace block, escaped,
with the sensitive argument's value redacted. Screenshotted into
$SHARDQ_SCREENSHOTS (``docs/images`` refreshes the picture in docs/admin.md)."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.helpers import stepped_worker
from tests.taskapp.joblog_tasks import sync_invoices

pytestmark = pytest.mark.usefixtures("shards")

SECRET = "sk_live_do-not-show"


def test_a_jobs_page_shows_each_attempts_log_escaped_and_redacted(open_admin, viewer, tmp_path):
    result = sync_invoices.enqueue(42, api_key=SECRET)
    with stepped_worker(concurrency=1) as stepped:
        statuses = [o.status for _ in range(2) for o in stepped.step()]
    assert statuses == ["READY", "SUCCESSFUL"]

    page = open_admin(viewer)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"/admin/shardq/job/{result.id}/change/")
    logs = page.locator(".field-logs_display .shardq-log")
    expect(logs).to_have_count(2)
    expect(logs.nth(0).locator("strong")).to_have_text("Attempt 1")
    expect(logs.nth(1).locator("strong")).to_have_text("Attempt 2")
    first = logs.nth(0).locator("pre")
    expect(first).to_contain_text("attempt 1: fetching invoices of customer 42 with key [redacted]")
    # The task's markup is text: shown as written, never rendered.
    expect(first).to_contain_text("503 <b>Service Unavailable</b>")
    assert first.locator("b").count() == 0
    expect(logs.nth(1).locator("pre")).to_contain_text("invoice INV-0003 synced\n")
    assert "monospace" in first.evaluate("e => getComputedStyle(e).fontFamily")
    assert SECRET not in page.content()

    target = os.environ.get("SHARDQ_SCREENSHOTS")
    shots = Path(target) if target else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.locator("fieldset", has=page.locator(".field-logs_display")).screenshot(path=shots / "admin-job-logs.png")
