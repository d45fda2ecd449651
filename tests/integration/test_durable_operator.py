"""What an operator sees of durable jobs: the admin's job page (steps, the
cursor and its batches, suspensions, signals) and shardq_status (suspended
jobs by task)."""

import io
import json

import pytest
from django.core.management import call_command
from django.tasks import TaskResultStatus

import shardq
from tests.helpers import sql
from tests.taskapp import durable_tasks

pytestmark = pytest.mark.django_db


def suspended_job_with_records():
    """A backfill job as a worker leaves it mid-way: a step, a cursor 3
    batches into 95 items, then asleep until tomorrow; one signal sent."""
    result = durable_tasks.backfill.enqueue(tenant=1)
    job = int(result.id)
    sql(
        "UPDATE shardq_job SET status = 'SUSPENDED', started_at = clock_timestamp(),"
        " run_after = clock_timestamp() + interval '1 day' WHERE id = %s",
        [job],
    )
    sql(
        "INSERT INTO shardq_job_step (job_id, name, kind, output, fence, batches, total, done, until, recorded_at,"
        " updated_at) VALUES"
        " (%s, 'plan', 'step', '{\"items\": 95}', 1, 0, NULL, true, NULL, clock_timestamp(), clock_timestamp()),"
        " (%s, '$iterate#1', 'iterate', '{\"cursor\": 30}', 1, 3, 95, false, NULL, clock_timestamp(), clock_timestamp()),"
        " (%s, '$sleep#1', 'sleep', 'null', 1, 0, NULL, false, clock_timestamp() + interval '1 day',"
        "  clock_timestamp(), clock_timestamp())",
        [job, job, job],
    )
    shardq.signal(result, "approved", {"user": "ana"})
    return result


def test_a_suspended_job_is_running_to_django_and_its_records_show_on_its_admin_page(admin_client):
    result = suspended_job_with_records()
    assert result.task.get_result(result.id).status == TaskResultStatus.RUNNING
    page = admin_client.get(f"/admin/shardq/job/{result.id}/change/").content.decode()
    assert "Durable" in page
    assert 'data-status="SUSPENDED"' in page
    assert "Steps, iterations and suspensions" in page
    assert "<td>plan</td><td>step</td><td><code>{&quot;items&quot;: 95}</code></td><td>recorded</td>" in page
    assert "<code>{&quot;cursor&quot;: 30}</code></td><td>3 batches of 95 items</td>" in page
    assert "<td>$sleep#1</td><td>sleep</td>" in page and "<td>until " in page
    assert "<td>approved</td><td><code>{&quot;user&quot;: &quot;ana&quot;}</code></td>" in page
    assert "not consumed yet" in page


def test_a_plain_job_has_no_durable_section(admin_client):
    result = durable_tasks.pages.enqueue(last=3)
    page = admin_client.get(f"/admin/shardq/job/{result.id}/change/").content.decode()
    assert "Steps, iterations and suspensions" not in page


def test_shardq_status_shows_suspended_jobs_by_task():
    suspended_job_with_records()
    waiting = durable_tasks.approver.enqueue()
    sql(
        "UPDATE shardq_job SET status = 'SUSPENDED', run_after = '9999-12-01 00:00:00+00' WHERE id = %s",
        [int(waiting.id)],
    )
    out = io.StringIO()
    call_command("shardq_status", "--json", stdout=out)
    report = json.loads(out.getvalue())
    by_task = {entry["task"]: entry for entry in report["suspended"]}
    assert by_task["tests.taskapp.durable_tasks.backfill"]["jobs"] == 1
    assert by_task["tests.taskapp.durable_tasks.backfill"]["next_wake"] is not None
    assert by_task["tests.taskapp.durable_tasks.approver"]["waiting_for_a_signal_with_no_timeout"] == 1
    assert report["jobs"]["SUSPENDED"] == 2
    out = io.StringIO()
    call_command("shardq_status", stdout=out)
    assert (
        "suspended tests.taskapp.durable_tasks.approver: 1 (1 wait for a signal with no timeout; none wakes by time)"
        in (out.getvalue())
    )
