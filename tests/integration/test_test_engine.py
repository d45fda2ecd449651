"""The tests' own database engine (tests/pgtest/base.py) and settings: the
flush after a transactional test leaves every table as Django's TRUNCATE
would (empty, sequences where they were), whichever way it takes; the test
database commits without waiting for the WAL flush (tests/conftest.py)."""

import pytest
from django.core.management import call_command
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import job_factory, scalar, sql
from tests.pgtest.base import TRUNCATE_ABOVE_BYTES


def table_sizes() -> dict[str, int]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    return {table: scalar(f'SELECT count(*) FROM "{table}"') for table in tables}


def truncations() -> int:
    """How many times this database has made a new file for shardq_job (a
    TRUNCATE does; a DELETE never does)."""
    return scalar("SELECT relfilenode FROM pg_class WHERE oid = 'shardq_job'::regclass")


def flush() -> None:
    """The flush pytest-django runs after a transactional test (Django's
    TransactionTestCase: no sequence reset), without the post_migrate that
    writes the content types and permissions back."""
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True)


def fill(jobs: int, users: int) -> None:
    job_factory(jobs, shard=lambda i: i % 64)
    for i in range(users):
        sql(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff, "
            "is_active, date_joined) VALUES ('', false, %s, '', '', '', false, true, clock_timestamp())",
            [f"user{i}"],
        )
    # A child row whose parent is deleted before it in the flush's order only
    # works because the FOREIGN KEYs are deferred to the commit.
    sql("INSERT INTO django_content_type (app_label, model) VALUES ('flush', 'probe')")
    sql(
        "INSERT INTO auth_permission (name, content_type_id, codename) "
        "SELECT 'probe', id, 'probe' FROM django_content_type WHERE app_label = 'flush'"
    )


@pytest.mark.django_db(transaction=True)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.integers(0, 30), users=st.integers(0, 3))
def test_the_flush_of_small_tables_deletes_every_row_and_keeps_the_files_and_sequences(jobs, users):
    fill(jobs, users)
    next_id = scalar("SELECT last_value FROM shardq_job_id_seq")
    before = truncations()
    flush()
    assert not any(table_sizes().values()), table_sizes()
    assert truncations() == before, "a small flush DELETEs (no new file)"
    assert scalar("SELECT last_value FROM shardq_job_id_seq") == next_id, "a flush resets no sequence"


@pytest.mark.django_db(transaction=True)
def test_a_table_grown_past_the_bound_is_flushed_with_truncate():
    fill(1, 1)
    sql(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, "
        "worker_losses) SELECT task_path, backend, queue_name, priority, run_after, mod(g, 64), g, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, "
        "worker_losses FROM shardq_job, generate_series(1, 5000) AS g"
    )
    assert scalar("SELECT pg_total_relation_size('shardq_job')") > TRUNCATE_ABOVE_BYTES
    before = truncations()
    flush()
    assert not any(table_sizes().values()), table_sizes()
    assert truncations() != before, "a table past the bound is TRUNCATEd"


@pytest.mark.django_db(transaction=True)
def test_the_test_database_commits_without_waiting_for_the_wal_flush():
    assert scalar("SHOW synchronous_commit") == "off"
