"""Before ``manage.py migrate`` has created shardq's tables, the worker, an
enqueue and the admin each say "shardq's tables are missing: run manage.py
migrate", never a traceback or a raw ProgrammingError."""

import html

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from shardq.db.store import WorkerStore
from shardq.exceptions import TablesMissing
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGE = "shardq's tables are missing: run manage.py migrate"


@pytest.fixture
def unmigrated():
    """shardq's tables moved out of sight (a schema of their own) as if
    migrate had not created them yet; moved back after the test."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'shardq\\_%'")
        hidden = [name for (name,) in cursor.fetchall()]
        cursor.execute("CREATE SCHEMA shardq_unmigrated")
        for name in hidden:
            cursor.execute(f'ALTER TABLE public."{name}" SET SCHEMA shardq_unmigrated')
    try:
        yield
    finally:
        connection.close()  # its prepared statements name the moved tables
        with connection.cursor() as cursor:
            for name in hidden:
                cursor.execute(f'ALTER TABLE shardq_unmigrated."{name}" SET SCHEMA public')
            cursor.execute("DROP SCHEMA shardq_unmigrated")


def test_an_enqueue_before_migrate_says_to_run_migrate(unmigrated):
    with pytest.raises(TablesMissing) as raised:
        tasks.add.enqueue(1, 2)

    assert str(raised.value).startswith(MESSAGE)
    assert 'relation "shardq_job" does not exist' in str(raised.value)


def test_the_worker_before_migrate_says_to_run_migrate_and_starts_nothing(unmigrated):
    with pytest.raises(CommandError) as raised:
        call_command("shardq_worker", "--concurrency", "1")

    assert str(raised.value).startswith(MESSAGE)
    assert "database 'default'" in str(raised.value)


def test_the_worker_store_translates_a_missing_table_at_its_boundary(unmigrated):
    store = WorkerStore(application_name="shardq-test")
    try:
        with pytest.raises(TablesMissing, match=r"^shardq's tables are missing: run manage\.py migrate"):
            store.register_worker("00000000-0000-0000-0000-000000000001", "host", 1, [])
    finally:
        store.close()


@pytest.mark.parametrize("page", ["job", "shard", "shardevent", "worker", "dashboard", "limitslot"])
def test_the_admin_before_migrate_shows_a_page_that_says_to_run_migrate(admin_client, unmigrated, page):
    response = admin_client.get(f"/admin/shardq/{page}/")

    assert response.status_code == 503
    assert MESSAGE in html.unescape(response.content.decode())
