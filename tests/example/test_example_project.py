"""The example project as a user runs it: DEBUG off, the admin styled by
WhiteNoise, no page framed, a job's status only for a logged-in user."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from example_project.demo.tasks import send_receipt

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    user = get_user_model().objects.create_user("ops", password="ops-pass-1", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def test_the_admins_static_files_are_served_with_debug_off(settings, client):
    assert settings.DEBUG is False

    page = client.get("/admin/login/")
    css = client.get("/static/admin/css/base.css")

    assert page.status_code == 200 and "/static/admin/css/base.css" in page.text
    assert css.status_code == 200 and css["Content-Type"].startswith("text/css")
    assert b"".join(css.streaming_content)  # the file itself, not an empty body


def test_pages_forbid_being_framed(client):
    assert client.get("/admin/login/")["X-Frame-Options"] == "DENY"


def test_a_jobs_status_needs_a_login(client, staff_client):
    job = send_receipt.enqueue(customer_id=3, order_id=9)

    anonymous = client.get(f"/jobs/{job.id}/")
    logged_in = staff_client.get(f"/jobs/{job.id}/")

    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/?next=/jobs/")
    assert logged_in.status_code == 200 and logged_in.json()["status"] == "READY"


@pytest.mark.parametrize("url", ["notaurl", "postgres//user:secret@db/app", "http://db/app"])
def test_a_database_url_that_cannot_be_parsed_is_named_as_unparsable(monkeypatch, url):
    import runpy
    from pathlib import Path

    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv("DATABASE_URL", url)
    settings_file = Path(__file__).resolve().parents[2] / "example_project" / "settings.py"

    with pytest.raises(ImproperlyConfigured, match="is unparsable as a database URL: write postgres://") as raised:
        runpy.run_path(str(settings_file))

    assert "secret" not in str(raised.value)
