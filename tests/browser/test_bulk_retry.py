"""The job list's "Retry all matching" in a real browser (docs/admin.md,
"Bulk actions"): the list filtered to one queue's dead letters, the button,
the confirmation with the count, and the progress page until it is done;
every matching job on every page is retried, nothing else."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.rows import sql
from tests.integration.test_bulk_actions import dead_letters, statuses
from tests.taskapp import tasks

pytestmark = pytest.mark.usefixtures("shards")


def test_a_filtered_bulk_retry_reaches_every_page_and_shows_its_progress(open_admin, superuser, tmp_path):
    emails = dead_letters(tasks.noop, 260)  # three pages of the list
    sql("UPDATE shardq_job SET queue_name = 'emails' WHERE id = ANY(%s)", [emails])
    others = dead_letters(tasks.noop, 7)
    page = open_admin(superuser)
    page.goto("/admin/shardq/job/?queue=emails&status__exact=FAILED")
    expect(page.locator("#result_list tbody tr")).to_have_count(100)
    page.get_by_role("link", name="Retry all matching").click()
    expect(page.locator("#bulk-total")).to_have_text("260")
    expect(page.locator("#bulk-filter")).to_have_text("queue=emails&status__exact=FAILED")
    page.locator("#bulk-confirm").click()
    expect(page.locator("#bulk-state")).to_have_text("done", timeout=60_000)
    expect(page.locator("#bulk-count")).to_have_text("260 / 260")
    expect(page.locator("#bulk-done")).to_have_text("260")
    target = os.environ.get("SHARDQ_SCREENSHOTS")
    shots = Path(target) if target else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "admin-bulk-progress.png", full_page=True)
    assert statuses(emails) == {"READY": 260}
    assert statuses(others) == {"FAILED": 7}
    page.get_by_role("link", name="Back to the jobs").click()
    page.goto("/admin/shardq/job/?queue=emails&status__exact=FAILED")
    expect(page.locator("#result_list")).to_have_count(0)
