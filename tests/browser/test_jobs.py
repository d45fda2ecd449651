"""Jobs in the admin, in a real browser: filters, search, redaction of
sensitive arguments, readable tracebacks, and the permission-checked
dead-letter actions (Retry, Discard)."""

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from playwright.sync_api import expect

from shardq.conf import get_config
from shardq.db.store import connect
from tests.browser.rows import changelist_row, csrf_post, fail_job, job_row, shard_of, sql
from tests.taskapp.admin_tasks import rotate_token, ship, sign_in

pytestmark = pytest.mark.usefixtures("shards")

SECRET = "hunter2-do-not-show"


def result_ids(page) -> set[int]:
    return {int(text) for text in page.locator("#result_list tbody th.field-id").all_inner_texts()}


def stable(row: dict) -> dict:
    """A job row without its clock-dependent figure."""
    return {k: v for k, v in row.items() if k != "due_seconds_ago"}


def select(page, *job_ids) -> None:
    for job_id in job_ids:
        changelist_row(page, "id", job_id).locator("input.action-select").check()


def run_action(page, name: str) -> None:
    page.locator("#changelist-form select[name=action]").select_option(name)
    page.locator("#changelist-form button[name=index]").click()


def test_job_list_filters_to_the_dead_letter_queue(open_admin, viewer):
    dead = [ship.enqueue(order_id=n).id for n in (1, 2)]
    failed_with_attempts_left = ship.enqueue(order_id=3).id
    ready = ship.enqueue(order_id=4).id
    for job_id in dead:
        fail_job(job_id)
    # FAILED after 1 of its 2 attempts (e.g. its task could not be found).
    fail_job(failed_with_attempts_left, attempts=1)

    page = open_admin(viewer)
    page.goto("/admin/shardq/job/")
    assert result_ids(page) == {*map(int, dead), int(failed_with_attempts_left), int(ready)}

    page.get_by_role("link", name="dead-lettered (FAILED, out of attempts)").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    assert result_ids(page) == set(map(int, dead))
    expect(page.locator("#result_list [data-status=FAILED]").first).to_have_text("FAILED · dead-letter")

    page.goto("/admin/shardq/job/?status__exact=FAILED")
    expect(page.locator("#result_list tbody tr")).to_have_count(3)

    # Search: a job id, then an exact shard key.
    page.goto("/admin/shardq/job/")
    page.fill("#searchbar", str(ready))
    page.press("#searchbar", "Enter")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert result_ids(page) == {int(ready)}
    page.fill("#searchbar", "3")
    page.press("#searchbar", "Enter")  # order_id 3 is the shard key of one job
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert int(failed_with_attempts_left) in result_ids(page)


def test_sensitive_arguments_are_redacted_in_the_list_and_the_detail_page(open_admin, viewer):
    positional = sign_in.enqueue("acct-7", SECRET, remember=True).id
    by_keyword = sign_in.enqueue(account="acct-8", password=SECRET).id
    everything = rotate_token.enqueue(SECRET, note=f"note {SECRET}").id
    fail_job(positional, message="bad credentials")

    page = open_admin(viewer)
    page.goto("/admin/shardq/job/")
    expect(page.locator("#result_list tbody tr")).to_have_count(3)
    assert SECRET not in page.content()
    cell = changelist_row(page, "id", positional).locator("td.field-arguments_display")
    expect(cell).to_have_text('"acct-7", "[redacted]", remember=true')
    expect(changelist_row(page, "id", by_keyword).locator("td.field-arguments_display")).to_have_text(
        'account="acct-8", password="[redacted]"'
    )
    expect(changelist_row(page, "id", everything).locator("td.field-arguments_display")).to_have_text(
        '"[redacted]", note="[redacted]"'
    )
    # The key (account) is not sensitive and stays visible.
    expect(changelist_row(page, "id", positional).locator("td.field-shard_key_display")).to_have_text("acct-7")

    page.goto(f"/admin/shardq/job/{positional}/change/")
    assert SECRET not in page.content()
    expect(page.locator(".field-args_display pre")).to_contain_text('"[redacted]"')
    expect(page.locator(".field-args_display pre")).to_contain_text('"acct-7"')
    expect(page.locator(".field-redaction")).to_contain_text("Marked sensitive: password.")
    # The traceback keeps its lines (preformatted), one block an attempt.
    tracebacks = page.locator(".field-errors_display pre.shardq-traceback")
    expect(tracebacks).to_have_count(3)
    assert tracebacks.first.inner_text().splitlines() == [
        "Traceback (most recent call last):",
        '  File "/srv/app/shop/tasks.py", line 12, in ship',
        "    raise ValueError(message)",
        "ValueError: bad credentials",
    ]
    expect(page.locator(".field-errors_display strong").first).to_have_text("#1 builtins.ValueError")

    page.goto(f"/admin/shardq/job/{everything}/change/")
    assert SECRET not in page.content()
    expect(page.locator(".field-kwargs_display pre")).to_contain_text('"note": "[redacted]"')
    expect(page.locator(".field-redaction")).to_contain_text("sensitive=True")
    # Read-only: no save button, no delete link.
    expect(page.locator("input[name=_save]")).to_have_count(0)
    expect(page.locator("a.deletelink")).to_have_count(0)


def test_retry_puts_a_dead_lettered_job_back_to_ready_with_a_fresh_budget(open_admin, superuser):
    first = ship.enqueue(order_id=11).id
    second = ship.enqueue(order_id=12).id
    for job_id in (first, second):
        fail_job(job_id)
    before = job_row(first)
    assert (before["status"], before["attempts"]) == ("FAILED", 2)

    listener = connect()
    try:
        listener.execute(f"LISTEN {get_config().channel}")
        page = open_admin(superuser)
        page.goto("/admin/shardq/job/?dead_letter=yes")
        select(page, first, second)
        # Meanwhile another operator retries the second job: it is no longer
        # FAILED when this retry runs, and must be left alone.
        sql(
            "UPDATE shardq_job SET status = 'READY', status_rank = status_rank + 1, attempts = 0 WHERE id = %s",
            [int(second)],
        )
        second_before = job_row(second)
        run_action(page, "retry_failed")

        expect(page.locator("ul.messagelist")).to_contain_text("Retried 1 job: now READY with a fresh attempt budget.")
        expect(page.locator("ul.messagelist .warning")).to_contain_text(
            f"Skipped 1 job not FAILED (any more): #{second}"
        )
        after = job_row(first)
        assert after["status"] == "READY"
        assert after["attempts"] == 0
        assert after["status_rank"] == before["status_rank"] + 1
        assert after["errors"] == before["errors"]  # kept as history
        assert after["finished_at"] is None
        assert 0 <= after["due_seconds_ago"] < 60  # due now, by the database clock
        assert stable(job_row(second)) == stable(second_before)
        # Workers are woken on the job's shard, as enqueue wakes them.
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
        [(priority,)] = sql("SELECT priority FROM shardq_job WHERE id = %s", [int(first)])
        assert payloads == [f"{shard_of(first)}:{priority}"]
    finally:
        listener.close()

    # The dead-letter queue no longer lists it.
    page.goto("/admin/shardq/job/?dead_letter=yes")
    expect(page.locator("#result_list tbody tr")).to_have_count(0)


def test_retry_from_the_job_page(open_admin, retrier):
    job_id = ship.enqueue(order_id=21).id
    fail_job(job_id)
    page = open_admin(retrier)
    page.goto(f"/admin/shardq/job/{job_id}/change/")
    options = page.locator("select[name='CHANGE_FORM-action'] option").all_inner_texts()
    assert any(o.startswith("Retry") for o in options) and not any(o.startswith("Discard") for o in options)
    page.locator("select[name='CHANGE_FORM-action']").select_option("retry_failed")
    page.get_by_role("button", name="Run").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Retried 1 job")
    assert job_row(job_id)["status"] == "READY"


def test_staff_without_the_permissions_gets_no_dead_letter_action_and_a_forged_post_changes_nothing(
    open_admin, viewer, retrier
):
    dead = ship.enqueue(order_id=31).id
    fail_job(dead)
    before = job_row(dead)

    page = open_admin(viewer)
    page.goto("/admin/shardq/job/?dead_letter=yes")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("select[name=action]")).to_have_count(0)
    expect(page.locator("input.action-select")).to_have_count(0)
    page.goto(f"/admin/shardq/job/{dead}/change/")
    expect(page.locator("select[name='CHANGE_FORM-action']")).to_have_count(0)

    # The same POST the retry button sends, made by hand: refused.
    for action in ("retry_failed", "discard_failed"):
        response = csrf_post(
            page, "/admin/shardq/job/?dead_letter=yes", {"action": action, "_selected_action": str(dead), "index": "0"}
        )
        assert response.status in (200, 302, 403)
        assert stable(job_row(dead)) == stable(before)

    # Retry permission alone does not grant Discard.
    page = open_admin(retrier)
    page.goto("/admin/shardq/job/?dead_letter=yes")
    names = page.locator("#changelist-form select[name=action] option").evaluate_all("os => os.map(o => o.value)")
    assert "retry_failed" in names and "discard_failed" not in names
    response = csrf_post(
        page,
        "/admin/shardq/job/?dead_letter=yes",
        {"action": "discard_failed", "_selected_action": str(dead), "index": "0"},
    )
    assert response.status in (200, 302, 403)
    assert job_row(dead) is not None


def test_discard_deletes_only_failed_jobs(open_admin, superuser):
    dead = ship.enqueue(order_id=41).id
    ready = ship.enqueue(order_id=42).id
    fail_job(dead)

    page = open_admin(superuser)
    page.goto("/admin/shardq/job/")
    select(page, dead, ready)
    run_action(page, "discard_failed")

    expect(page.locator("ul.messagelist")).to_contain_text("Discarded 1 job: deleted.")
    expect(page.locator("ul.messagelist .warning")).to_contain_text(f"Skipped 1 job not FAILED (any more): #{ready}")
    assert job_row(dead) is None
    assert job_row(ready)["status"] == "READY"
    assert result_ids(page) == {int(ready)}
    entry = LogEntry.objects.get(object_id=str(dead))
    assert entry.action_flag == DELETION and entry.user.username == superuser.username


def test_job_times_read_to_the_second_with_how_long_a_job_waited_and_ran(open_admin, viewer):
    done = ship.enqueue(order_id=51).id
    # Due at T, its final attempt started 1.5 s later and ran 2.25 s.
    sql(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', status_rank = 2, attempts = 1, "
        "enqueued_at = timestamptz '2026-03-04 05:06:07.25+00', run_after = timestamptz '2026-03-04 05:06:07.25+00', "
        "started_at = timestamptz '2026-03-04 05:06:08.75+00', "
        "last_attempted_at = timestamptz '2026-03-04 05:06:08.75+00', "
        "finished_at = timestamptz '2026-03-04 05:06:11+00' WHERE id = %s",
        [int(done)],
    )
    waiting = ship.enqueue(order_id=52).id
    sql("UPDATE shardq_job SET run_after = clock_timestamp() - interval '90 s' WHERE id = %s", [int(waiting)])

    page = open_admin(viewer)
    page.goto("/admin/shardq/job/")
    row = changelist_row(page, "id", done)
    expect(row.locator("td.field-enqueued_at_display")).to_have_text("2026-03-04 05:06:07")
    expect(row.locator("td.field-finished_at_display")).to_have_text("2026-03-04 05:06:11")
    assert float(row.locator("td.field-waited_display [data-seconds]").get_attribute("data-seconds")) == 1.5
    assert float(row.locator("td.field-ran_display [data-seconds]").get_attribute("data-seconds")) == 2.25
    expect(row.locator("td.field-ran_display")).to_have_text("2.25 s")
    # A READY job waits on: so far, marked as such; it has not run.
    row = changelist_row(page, "id", waiting)
    assert float(row.locator("td.field-waited_display [data-seconds]").get_attribute("data-seconds")) >= 90
    expect(row.locator("td.field-waited_display .shardq-so-far")).to_have_count(1)
    expect(row.locator("td.field-ran_display")).to_have_text("—")

    page.goto(f"/admin/shardq/job/{done}/change/")
    expect(page.locator(".field-started_at_display time")).to_have_attribute(
        "datetime", "2026-03-04T05:06:08.750000+00:00"
    )
    expect(page.locator(".field-started_at_display")).to_contain_text("2026-03-04 05:06:08")
    expect(page.locator(".field-waited_display")).to_contain_text("1.50 s")
    expect(page.locator(".field-ran_display")).to_contain_text("2.25 s")
    expect(page.locator(".field-total_display")).to_contain_text("3.75 s")
