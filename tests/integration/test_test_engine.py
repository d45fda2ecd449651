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
from tests.pgtest.base import TRUNCATE_ABOVE_BYTES, kept_tables


def table_sizes() -> dict[str, int]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    return {table: scalar(f'SELECT count(*) FROM "{table}"') for table in tables}


def tables_past_the_bound() -> list[str]:
    """The tables whose size (with indexes and TOAST) makes the flush TRUNCATE."""
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    return [
        t for t in tables if scalar("SELECT pg_total_relation_size(%s::regclass)", [f'"{t}"']) > TRUNCATE_ABOVE_BYTES
    ]


def kept_rows_are_the_copies() -> bool:
    """Each kept table holds exactly the rows of its copy in ``pgtest``."""
    kept = kept_tables(connection)
    assert {"django_content_type", "auth_permission", "shardq_shard", "shardq_cluster"} <= set(kept), kept
    return all(
        scalar(
            f'SELECT NOT EXISTS ((TABLE "{t}" EXCEPT TABLE pgtest."{t}") UNION ALL (TABLE pgtest."{t}" EXCEPT TABLE "{t}"))'
        )
        for t in kept
    )


def post_migrate_rows() -> set[tuple]:
    """What post_migrate writes, ids aside: the content types and
    permissions by their natural keys, shardq's cluster row and its lease rows."""
    return {
        *sql(
            "SELECT 'content type', ct.app_label, ct.model, p.codename, p.name FROM django_content_type AS ct "
            "LEFT JOIN auth_permission AS p ON p.content_type_id = ct.id"
        ),
        *sql("SELECT 'cluster', id, shard_count, version, reshard_from, switched_at FROM shardq_cluster"),
        *sql("SELECT 'shard', pool, shard, owner, lease_expires, claim_version, claimed_at FROM shardq_shard"),
    }


def truncations() -> int:
    """How many times this database has made a new file for shardq_job (a
    TRUNCATE does; a DELETE never does)."""
    return scalar("SELECT relfilenode FROM pg_class WHERE oid = 'shardq_job'::regclass")


def flush() -> None:
    """The flush pytest-django runs after a transactional test (Django's
    TransactionTestCase: no sequence reset), without post_migrate (the
    tests' flush command sends none after the engine's flush either)."""
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True)


def emptied() -> dict[str, int]:
    """The tables that still hold rows, besides the kept ones."""
    kept = kept_tables(connection)
    return {table: rows for table, rows in table_sizes().items() if rows and table not in kept}


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
@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(jobs=st.integers(0, 30), users=st.integers(0, 3))
def test_the_flush_of_small_tables_deletes_every_row_and_keeps_the_files_and_sequences(jobs, users):
    fill(jobs, users)
    next_id = scalar("SELECT last_value FROM shardq_job_id_seq")
    before = truncations()
    # A table may come to this test past the bound (an earlier test's
    # rolled-back bulk insert leaves its file grown, and no flush followed):
    # then the flush TRUNCATEs, as it must, and leaves every table small for
    # the next example. This failed as a flaky test in a whole run.
    grown = tables_past_the_bound()
    flush()
    assert emptied() == {}
    assert kept_rows_are_the_copies(), "what post_migrate wrote is put back as it wrote it"
    if grown:
        assert truncations() != before, f"tables past the bound ({grown}) are TRUNCATEd"
    else:
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
    assert emptied() == {}
    assert kept_rows_are_the_copies(), "what post_migrate wrote is put back after the TRUNCATE too"
    assert truncations() != before, "a table past the bound is TRUNCATEd"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("jobs", [3, 5000], ids=["delete", "truncate"])
def test_after_either_flush_the_tables_hold_what_djangos_flush_and_post_migrate_leave_and_no_signal_is_sent(jobs):
    from django.core.management.color import no_style
    from django.core.management.sql import emit_post_migrate_signal
    from django.db.backends.postgresql.operations import DatabaseOperations
    from django.db.models.signals import post_migrate

    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    # Django's own flush (its TRUNCATE of every table), then its post_migrate.
    connection.ops.execute_sql_flush(DatabaseOperations.sql_flush(connection.ops, no_style(), tables))
    emit_post_migrate_signal(0, False, "default")
    djangos = post_migrate_rows()
    assert djangos and not scalar("SELECT count(*) FROM shardq_job")
    fill(1, 1)
    sql(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, "
        "worker_losses) SELECT task_path, backend, queue_name, priority, run_after, mod(g, 64), g, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, "
        "worker_losses FROM shardq_job, generate_series(1, %s) AS g",
        [jobs - 1],
    )
    sql("UPDATE shardq_shard SET owner = gen_random_uuid(), claim_version = 7 WHERE shard < 3")
    sql("DELETE FROM shardq_shard WHERE shard = 63")
    assert (scalar("SELECT pg_total_relation_size('shardq_job')") > TRUNCATE_ABOVE_BYTES) == (jobs > 100)
    sent = []

    def receiver(**kwargs):
        sent.append(kwargs["app_config"].label)

    post_migrate.connect(receiver, dispatch_uid="test_engine_probe")
    try:
        # The tests' flush, as a transactional test's teardown runs it.
        call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
    finally:
        post_migrate.disconnect(dispatch_uid="test_engine_probe")
    assert post_migrate_rows() == djangos
    assert emptied() == {}
    assert sent == [], "the rows were put back: no post_migrate"


@pytest.mark.django_db(transaction=True)
def test_the_test_database_commits_without_waiting_for_the_wal_flush():
    assert scalar("SHOW synchronous_commit") == "off"


@pytest.mark.django_db
def test_the_test_database_is_a_copy_of_a_template_labelled_with_what_migrate_builds_and_is_fully_migrated():
    """tests/pgtest/creation.py: the test database was copied from the
    template whose label is the fingerprint of this checkout's migrations (a
    changed migration would have rebuilt it), and every migration on disk is
    applied in it, with every model's table present."""
    from django.apps import apps
    from django.db.migrations.executor import MigrationExecutor

    from tests.pgtest.creation import fingerprint, template_enabled

    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
    tables = set(connection.introspection.table_names())
    assert {model._meta.db_table for model in apps.get_models() if model._meta.managed} <= tables
    if template_enabled():
        template = connection.creation.from_template
        assert template is not None
        label = scalar("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", [template])
        assert label == fingerprint()


@pytest.mark.django_db(transaction=True)
def test_the_flush_empties_the_job_history_too():
    # shardq_job_history is a migration's table, no model's: Django's flush
    # leaves it, and a test's archived jobs would be counted by the next.
    fill(3, 0)
    sql(
        "CREATE TABLE shardq_job_history_flushprobe PARTITION OF shardq_job_history "
        "FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')"
    )
    try:
        sql("UPDATE shardq_job SET status = 'SUCCESSFUL', finished_at = '2000-01-01 12:00+00'")
        sql("INSERT INTO shardq_job_history SELECT * FROM shardq_job")
        assert scalar("SELECT count(*) FROM shardq_job_history") == 3
        flush()
        assert scalar("SELECT count(*) FROM shardq_job_history") == 0
        assert emptied() == {}
    finally:
        sql("DROP TABLE shardq_job_history_flushprobe")
