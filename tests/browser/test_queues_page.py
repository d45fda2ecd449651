"""The admin's Queues page in a real browser (docs/admin.md, "Queues"):
the Pause button pauses a queue for every worker (a stepped worker in this
process stops claiming it), Resume undoes it, and an operator without the
permission sees no buttons."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

import shardq
from shardq import queues
from tests.browser.rows import VIEW_PERMISSIONS, make_user, sql
from tests.helpers import stepped_worker
from tests.taskapp import tasks

pytestmark = pytest.mark.usefixtures("shards")


def screenshot_dir(tmp_path: Path) -> Path:
    target = os.environ.get("SHARDQ_SCREENSHOTS")
    path = Path(target) if target else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_the_pause_button_stops_the_queue_being_claimed_and_resume_lets_it_run(open_admin, superuser, tmp_path):
    reports = [int(r.id) for r in shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(3)])]
    page = open_admin(superuser)
    page.get_by_role("link", name="Queues").click()
    row = page.locator("#queues tr[data-queue='reports']")
    expect(row.locator(".queue-state")).to_have_text("running")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".messagelist")).to_contain_text("Paused queue reports")
    row = page.locator("#queues tr[data-queue='reports']")
    expect(row.locator(".queue-state")).to_have_text("paused")
    expect(row.locator(".queue-changed")).to_contain_text("by admin:operator")
    row.locator("input[name=concurrency]").fill("4")
    row.get_by_role("button", name="Set").click()
    expect(page.locator("#queues tr[data-queue='reports'] .queue-concurrency")).to_have_text("4 per worker")
    page.screenshot(path=screenshot_dir(tmp_path) / "admin-queues.png", full_page=True)
    with stepped_worker(concurrency=2) as worker:
        assert worker.claim() == [], "a worker must not claim the paused queue"
        assert dict(sql("SELECT status, count(*) FROM shardq_job WHERE id = ANY(%s) GROUP BY 1", [reports])) == {
            "READY": 3
        }
        page.locator("#queues tr[data-queue='reports']").get_by_role("button", name="Resume").click()
        expect(page.locator("#queues tr[data-queue='reports'] .queue-state")).to_have_text("running")
        worker.worker.fetcher.controls.notified("")  # the NOTIFY's effect, on this stepped worker
        assert sorted(job.id for job in worker.claim(3)) == sorted(reports)
    history = sql("SELECT change_message FROM django_admin_log WHERE object_id = 'reports' ORDER BY id")
    assert [m for (m,) in history] == [
        "Paused queue reports: no worker claims its jobs (running jobs finish).",
        "Queue reports: at most 4 jobs on each worker at once.",
        "Resumed queue reports.",
    ]


def test_an_operator_without_the_permission_sees_the_state_and_no_buttons(open_admin, django_user_model):
    viewer = make_user(django_user_model, "queue-viewer", permissions=[*VIEW_PERMISSIONS, "view_queuecontrol"])
    queues.pause("emails", by="shell:ops")
    page = open_admin(viewer)
    page.get_by_role("link", name="Queues").click()
    row = page.locator("#queues tr[data-queue='emails']")
    expect(row.locator(".queue-state")).to_have_text("paused")
    expect(row.locator(".queue-changed")).to_contain_text("by shell:ops")
    expect(page.locator("#queues button")).to_have_count(0)
