"""The job history in a real browser (docs/admin.md, "Job history"): jobs
enqueued, finished and moved by the archiver are listed newest first,
filtered by status, tag and finish date, searched by an argument's value
(never a sensitive one), and shown on their page, read-only. Screenshots
(``SHARDQ_SCREENSHOTS=docs/images``): admin-history.png,
admin-history-search.png."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from shardq.conf import get_config
from shardq.db.store import WorkerStore
from shardq.worker.archiver import Archiver
from shardq.worker.stats import Stats
from tests.helpers import sql
from tests.taskapp.admin_tasks import charge, ship

pytestmark = pytest.mark.usefixtures("shards")


@pytest.fixture
def archiver(transactional_db):
    """The archiver, stepped by the test, with no grace. The history's
    partitions (and their rows) outlive a test's flush: the test starts
    with none and leaves none (the dashboard's tests count the history's
    jobs of the last minutes)."""

    def drop_partitions():
        for (name,) in sql(
            "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'shardq_job_history'::regclass"
        ):
            sql(f'DROP TABLE "{name}"')

    drop_partitions()
    history = dataclasses.replace(get_config().history, grace_seconds=0.0)
    service = Archiver(WorkerStore(application_name="shardq-archiver-browser"), history, Stats())
    yield service
    service.store.close()
    drop_partitions()


def finish(ids, status: str, *, error: str | None = None, value=None) -> None:
    """The columns the completer writes for an outcome (shardq/db/sql/job.sql),
    as if each job had been enqueued 10 s ago, started 50 ms after and run 300 ms."""
    errors = [] if error is None else [{"exception_class_path": error, "traceback": f"{error}: x\n"}]
    sql(
        "UPDATE shardq_job SET status = %s, status_rank = status_rank + 2, attempts = 1, "
        "enqueued_at = clock_timestamp() - interval '10 s', run_after = clock_timestamp() - interval '10 s', "
        "started_at = clock_timestamp() - interval '9.95 s', last_attempted_at = clock_timestamp() - interval '9.95 s', "
        "finished_at = clock_timestamp() - interval '9.65 s', errors = %s::jsonb, "
        "return_value = %s::jsonb, worker_ids = '[\"web-1:4242\"]' WHERE id = ANY(%s)",
        [status, json.dumps(errors), json.dumps(value), list(ids)],
    )


def result_ids(page) -> list[int]:
    return [int(text) for text in page.locator("#result_list tbody th.field-id").all_inner_texts()]


def test_the_job_history_lists_filters_and_searches_archived_jobs(open_admin, viewer, archiver, tmp_path):
    customer_7 = [charge.enqueue(customer_id=7, amount=a, card="4111-1111").id for a in (120, 80)]
    vip = charge.using(tags=["billing", "vip"]).enqueue(customer_id=7, amount=990, card="4111-1111").id
    others = [charge.enqueue(customer_id=c, amount=50, card="4111-1111").id for c in (8, 9, 10)]
    shipped = [ship.enqueue(order_id=o).id for o in (7, 11, 12)]  # another argument's 7: not found
    cancelled = charge.enqueue(customer_id=7, amount=5, card="4111-1111").id
    finish([*customer_7, vip, *others, *shipped], "SUCCESSFUL", value={"ok": True})
    finish([cancelled], "FAILED", error="shardq.exceptions.Cancelled")
    archiver.maintain()
    assert archiver.pass_once() == 10
    assert sql("SELECT count(*) FROM shardq_job")[0][0] == 0  # all of them in history now

    target = os.environ.get("SHARDQ_SCREENSHOTS")
    shots = Path(target) if target else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page = open_admin(viewer)
    page.goto("/admin/shardq/jobhistory/")
    expect(page.locator("#result_list tbody tr")).to_have_count(10)
    everything = sorted(map(int, [*customer_7, vip, *others, *shipped, cancelled]), reverse=True)
    assert result_ids(page) == everything
    expect(page.locator("#result_list")).not_to_contain_text("4111-1111")  # card is sensitive
    expect(page.locator(".paginator")).to_contain_text("10 job history")
    # Read-only: no action, no checkbox.
    expect(page.locator("#result_list input.action-select")).to_have_count(0)
    page.set_viewport_size({"width": 1400, "height": 760})
    page.screenshot(path=shots / "admin-history.png")

    # Filters: the status, the tag, the finish date (the partition key).
    page.goto("/admin/shardq/jobhistory/?status__exact=FAILED")
    assert result_ids(page) == [int(cancelled)]
    page.goto("/admin/shardq/jobhistory/?tag=vip")  # a tag given with .using(): not among the choices
    assert result_ids(page) == [int(vip)]
    page.goto("/admin/shardq/jobhistory/")
    page.locator("#changelist-filter").get_by_role("link", name="billing").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(7)
    page.goto("/admin/shardq/jobhistory/")
    page.locator("#changelist-filter").get_by_role("link", name="Today").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(10)

    # Search by an argument's value, over the history's GIN index.
    page.goto("/admin/shardq/jobhistory/")
    page.locator("#searchbar").fill("customer_id=7")
    page.locator("#searchbar").press("Enter")
    expect(page.locator("#result_list tbody tr")).to_have_count(4)
    assert result_ids(page) == sorted(map(int, [*customer_7, vip, cancelled]), reverse=True)
    expect(page.locator("#result_list code.shardq-args").first).to_contain_text("customer_id=7")
    page.set_viewport_size({"width": 1400, "height": 560})
    page.screenshot(path=shots / "admin-history-search.png")

    # Never by a sensitive argument: a match would confirm a guess.
    page.locator("#searchbar").fill('card="4111-1111"')
    page.locator("#searchbar").press("Enter")
    expect(page.locator("#result_list")).to_have_count(0)

    # A job's page: its outcome, read-only.
    page.goto(f"/admin/shardq/jobhistory/{vip}/change/")
    expect(page.locator("#content")).to_contain_text("SUCCESSFUL")
    expect(page.locator("#content")).to_contain_text("customer_id")
    expect(page.locator("#content")).not_to_contain_text("4111-1111")
    expect(page.locator("input[type=submit][name=_save]")).to_have_count(0)
