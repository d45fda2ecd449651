"""The admin's lists without a browser: what a page says against the rows it
shows, when rows change between the page's statements (as they do under a
running worker)."""

import html
import re

import pytest
from django.contrib.admin.sites import site
from django.db import connection

from shardq.models import Job
from tests.browser.rows import fail_job
from tests.taskapp.admin_tasks import ship


def render_changelist(rf, user, url: str, between=None) -> str:
    """The job list at ``url``, with ``between()`` run right after the list's
    COUNT statement (a job a worker fails in that instant)."""
    request = rf.get(url)
    request.user = user
    pending = [between] if between else []

    def after_count(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if pending and sql.lstrip().upper().startswith("SELECT COUNT("):
            pending.pop()()
        return result

    with connection.execute_wrapper(after_count):
        response = site._registry[Job].changelist_view(request)
        response.render()
    return response.content.decode()


def shown(html: str) -> tuple[int, int, int]:
    """(rows in the table, "N results" of the search bar, "N jobs" of the paginator)."""
    rows = len(re.findall(r'<th class="field-id">', html))
    results = int(re.search(r"(\d+) results?\b", html).group(1))
    paginator = int(re.search(r'class="paginator".*?(\d+) jobs?\b', html, re.S).group(1))
    return rows, results, paginator


@pytest.mark.django_db
def test_a_job_list_counts_the_rows_it_shows_when_a_job_fails_between_its_statements(rf, admin_user):
    """Right after a Retry the retried job runs, and may fail again while the
    page loads: the list said "1 result" over 2 rows."""
    earlier = ship.enqueue(order_id=1).id
    retried = ship.enqueue(order_id=2).id
    fail_job(earlier)
    html = render_changelist(rf, admin_user, "/admin/shardq/job/?status__exact=FAILED", lambda: fail_job(retried))
    assert shown(html) == (2, 2, 2)
    assert f">{retried}<" in html


@pytest.mark.django_db
def test_a_list_longer_than_a_page_still_shows_one_page(rf, admin_user, monkeypatch):
    admin = site._registry[Job]
    monkeypatch.setattr(admin, "list_per_page", 3)
    for n in range(5):
        ship.enqueue(order_id=n)
    rows, results, _ = shown(render_changelist(rf, admin_user, "/admin/shardq/job/"))
    assert (rows, results) == (3, 5)


@pytest.mark.django_db
def test_a_job_rescued_past_its_attempts_says_why_it_ran_again(admin_client):
    # What a rescue after --grace ran out leaves: attempt 1 lost with its
    # worker, attempt 2 run to the end, on a task allowing one attempt.
    from tests.helpers import job_factory, sql

    [job_id] = job_factory(max_attempts=1, worker_losses=1)
    sql(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', attempts = 2, finished_at = clock_timestamp() WHERE id = %s",
        [job_id],
    )

    listed = html.unescape(admin_client.get("/admin/shardq/job/").content.decode())
    detail = html.unescape(admin_client.get(f"/admin/shardq/job/{job_id}/change/").content.decode())

    assert re.search(r"2/1 <span[^>]*>\(1 lost\)</span>", listed)
    assert "why it ran again" in detail.lower()
    assert "One attempt of this job stopped without an outcome: its worker was lost" in detail
    assert "runs again whatever max_attempts says" in detail
