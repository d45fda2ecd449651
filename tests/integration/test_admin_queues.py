"""The admin's Queues page without a browser: the controls are POSTs behind
``shardq.change_queuecontrol``; viewing needs ``view_queuecontrol``."""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from shardq import queues
from tests.helpers import scalar

pytestmark = pytest.mark.django_db


def staff(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="shardq", codename__in=codenames))
    return user


def test_a_viewer_sees_the_queues_but_may_not_pause_one(client, django_user_model):
    queues.pause("emails", by="shell:ops")
    client.force_login(staff(django_user_model, "viewer", "view_queuecontrol"))
    page = client.get(reverse("admin:shardq_queuecontrol_changelist"))
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-queue="emails"' in text and "paused" in text and 'value="pause"' not in text
    refused = client.post(reverse("admin:shardq_queuecontrol_control"), {"action": "pause", "queue": "reports"})
    assert refused.status_code == 403
    assert scalar("SELECT count(*) FROM shardq_queue_control WHERE queue_name = 'reports'") == 0


def test_an_operator_pauses_sets_and_gets_a_clear_error_for_a_bad_count(client, django_user_model):
    client.force_login(staff(django_user_model, "ops", "view_queuecontrol", "change_queuecontrol"))
    url = reverse("admin:shardq_queuecontrol_control")
    assert client.get(url).status_code == 405
    client.post(url, {"action": "pause", "queue": "reports"})
    assert scalar("SELECT paused FROM shardq_queue_control WHERE queue_name = 'reports'") is True
    page = client.post(url, {"action": "concurrency", "queue": "reports", "concurrency": "-3"}, follow=True)
    assert "Nothing changed: concurrency &#x27;-3&#x27;: give a whole number &gt;= 1" in page.content.decode()
    client.post(url, {"action": "concurrency", "queue": "reports", "concurrency": "5"})
    assert scalar("SELECT concurrency FROM shardq_queue_control WHERE queue_name = 'reports'") == 5
    assert scalar("SELECT count(*) FROM django_admin_log WHERE object_id = 'reports'") == 2
