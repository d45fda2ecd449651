"""The job list's bulk actions without a browser (docs/admin.md, "Bulk
actions"): buttons only for the actions a user may take, the whole filtered
set acted on (not the page), a progress page, and one LogEntry with the
filter and the count."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse

from shardq import bulk
from tests.helpers import scalar, sql, wait_until
from tests.integration.test_bulk_actions import dead_letters, statuses
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def staff(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="shardq", codename__in=codenames))
    return user


def test_a_viewer_gets_no_bulk_button_and_a_hand_made_request_is_refused(client, django_user_model):
    dead_letters(tasks.noop, 2)
    client.force_login(staff(django_user_model, "viewer", "view_job"))
    page = client.get(reverse("admin:shardq_job_changelist") + "?status__exact=FAILED")
    assert page.status_code == 200 and "all matching" not in page.content.decode()
    assert client.get(reverse("admin:shardq_job_bulk", args=["retry"])).status_code == 403
    assert client.post(reverse("admin:shardq_job_bulk", args=["retry"])).status_code == 403
    assert statuses(scalar("SELECT array_agg(id) FROM shardq_job")) == {"FAILED": 2}


def test_retry_all_matching_acts_on_every_page_of_the_filter_and_logs_filter_and_count(client, django_user_model):
    emails = dead_letters(tasks.noop, 130)  # more than a page (100)
    sql("UPDATE shardq_job SET queue_name = 'emails' WHERE id = ANY(%s)", [emails])
    default = dead_letters(tasks.noop, 5)
    retrier = staff(django_user_model, "retrier", "view_job", "retry_job")
    client.force_login(retrier)
    listing = client.get(reverse("admin:shardq_job_changelist") + "?queue=emails&status__exact=FAILED&p=1")
    text = listing.content.decode()
    assert "Retry all matching" in text and "Discard all matching" not in text
    url = reverse("admin:shardq_job_bulk", args=["retry"]) + "?queue=emails&amp;status__exact=FAILED"
    assert url in text, "the button carries the filter, not the page"
    url = url.replace("&amp;", "&")
    confirm = client.get(url)
    assert '<strong id="bulk-total">130</strong>' in confirm.content.decode()
    started = client.post(url)
    assert started.status_code == 302
    progress_url = started["Location"]
    operation_id = int(progress_url.rstrip("/").rsplit("/", 1)[1])
    wait_until(lambda: bulk.get(operation_id)["state"] == "done", timeout=60, message="the bulk retry to end")
    assert statuses(emails) == {"READY": 130}
    assert statuses(default) == {"FAILED": 5}, "jobs outside the filter are left alone"
    page = client.get(progress_url).content.decode()
    assert 'id="bulk-state" class="bulk-done">done' in page and 'id="bulk-done">130<' in page
    wait_until(lambda: LogEntry.objects.filter(object_repr=f"bulk retry #{operation_id}").exists(), timeout=30)
    entry = LogEntry.objects.get(object_repr=f"bulk retry #{operation_id}")
    assert entry.user_id == retrier.pk
    assert entry.change_message == (
        "Bulk retry from the admin, filter queue=emails&status__exact=FAILED: 130 jobs retried, 0 skipped "
        "(changed meanwhile)."
    )


def test_an_unknown_bulk_action_is_a_404_naming_the_actions(client, django_user_model):
    client.force_login(staff(django_user_model, "ops", "view_job", "retry_job"))
    page = client.get(reverse("admin:shardq_job_bulk", args=["explode"]))
    assert page.status_code == 404
