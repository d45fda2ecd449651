"""The tests' database engine: Django's PostgreSQL backend, with a flush that
empties small tables by DELETE instead of TRUNCATE.

pytest-django ends every transactional test (``transaction=True``, the
``transactional_db`` fixture, every worker and process test) with Django's
``flush``: one ``TRUNCATE`` of all 32 tables. On PostgreSQL a TRUNCATE makes
new files for each table and index and drops the old ones at commit, about
0.7 s for the 32 tables on this project's shared 2-core machine, where a
DELETE of the few rows a test leaves takes about 0.04 s (the tables' FOREIGN
KEYs are all DEFERRABLE: the order of the deletes does not matter inside one
transaction). The end state is the same: every table empty, no sequence
reset (Django's flush resets none unless a test asks, and that flush is left
as Django writes it).

After a flush Django's post_migrate writes back what it wrote after migrate:
the content types and permissions, shardq's cluster row and the lease rows
of its shards (about 0.9 s of ORM inserts a test under load, more than the
TRUNCATE itself once that was gone; then, with the rows kept, still 33
SELECTs a flush, about 0.09 s). ``keep_post_migrate_rows()``, called once
the test database is migrated (tests/conftest.py), flushes it as a test's
teardown would, with post_migrate, and copies every table that holds rows
then (what post_migrate wrote) into the schema ``pgtest``; the flush, either way it
takes, puts them back as they were, and the tests' ``flush`` command
(tests/taskapp/management/commands/flush.py) then sends no post_migrate:
the tables already hold what it would write. The rows are the ones
post_migrate would write (the same content types, permissions, cluster and
shard rows; their ids are the first ones it wrote rather than new ones).

DELETE leaves dead rows for autovacuum, so a table, with its indexes and
TOAST, that has grown past ``TRUNCATE_ABOVE_BYTES`` is flushed with Django's
TRUNCATE of all tables instead: the bloat a test can inherit stays bounded
(and a test that wrote 100,000 jobs is emptied in constant time). The choice
is made in the server, in one statement (a DO block), so the flush stays one
round trip. ``tests/integration/test_test_engine.py`` checks both paths.
"""

from django.db.backends.postgresql import base, operations

from tests.pgtest.creation import DatabaseCreation

TRUNCATE_ABOVE_BYTES = 1024 * 1024
#: The schema of the copies of what post_migrate wrote.
KEPT_SCHEMA = "pgtest"


def keep_post_migrate_rows(connection) -> list[str]:
    """Flush the test database as a test's teardown does (with post_migrate:
    nothing is kept yet), then copy every model table that holds rows (what
    post_migrate wrote) into the schema ``pgtest`` (not on the search path,
    and no model's table); the names of the tables copied. The copies are
    what Django's flush and post_migrate leave, whatever the database held
    (a kept one, ``--reuse-db``, may hold an interrupted run's rows)."""
    from django.core.management import call_command

    with connection.cursor() as cursor:
        cursor.execute(f"DROP SCHEMA IF EXISTS {KEPT_SCHEMA} CASCADE")
    call_command("flush", verbosity=0, interactive=False, database=connection.alias, reset_sequences=False)
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    kept = []
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {KEPT_SCHEMA}")
        for table in sorted(tables):
            name = connection.ops.quote_name(table)
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM public.{name})")
            if cursor.fetchone()[0]:
                cursor.execute(f"CREATE TABLE {KEPT_SCHEMA}.{name} AS TABLE public.{name}")
                kept.append(table)
    return kept


def kept_tables(connection) -> list[str]:
    """The tables ``keep_post_migrate_rows`` copied ([] before it ran)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename::text FROM pg_tables WHERE schemaname = %s ORDER BY 1", [KEPT_SCHEMA])
        return [row[0] for row in cursor.fetchall()]


def _text_array(names: list[str]) -> str:
    return "ARRAY[" + ", ".join("'" + name.replace("'", "''") + "'" for name in names) + "]::text[]"


class DatabaseOperations(operations.DatabaseOperations):
    def flush_puts_back_post_migrate_rows(self, *, reset_sequences: bool, allow_cascade: bool) -> bool:
        """Whether a flush with these options puts back what post_migrate
        wrote (then the tests' flush command sends no post_migrate)."""
        return not reset_sequences and not allow_cascade and bool(kept_tables(self.connection))

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or allow_cascade:
            return super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        [truncate] = super().sql_flush(style, tables)
        # A FOREIGN KEY that is not DEFERRABLE would make the DELETEs' order
        # matter: such a schema gets the TRUNCATE.
        return [
            f"""DO $flush$
DECLARE
    flushed text[] := {_text_array(list(tables))};
    name text;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(flushed) AS t(name)
               WHERE pg_total_relation_size(quote_ident(t.name)::regclass) > {int(TRUNCATE_ABOVE_BYTES)})
       OR EXISTS (SELECT 1 FROM pg_constraint
                  WHERE contype = 'f' AND NOT condeferrable
                    AND conrelid::regclass::text = ANY (SELECT quote_ident(n) FROM unnest(flushed) AS n)) THEN
        EXECUTE {"'" + truncate.replace("'", "''") + "'"};
    ELSE
        SET CONSTRAINTS ALL DEFERRED;
        FOREACH name IN ARRAY flushed LOOP
            EXECUTE format('DELETE FROM %I', name);
        END LOOP;
    END IF;
    -- What post_migrate wrote after migrate, put back (the tests' flush
    -- command then sends no post_migrate); the FOREIGN KEYs between the
    -- kept tables are checked at the commit.
    SET CONSTRAINTS ALL DEFERRED;
    FOR name IN SELECT tablename::text FROM pg_tables WHERE schemaname = '{KEPT_SCHEMA}' LOOP
        IF name = ANY (flushed) THEN
            EXECUTE format('INSERT INTO %I SELECT * FROM {KEPT_SCHEMA}.%I', name, name);
        END IF;
    END LOOP;
    -- shardq_job_history is no model's table (a migration's partitioned
    -- table), so Django's flush leaves it: its archived jobs would be
    -- counted by the next test (the dashboard, the history admin).
    IF 'shardq_job' = ANY (flushed) AND to_regclass('shardq_job_history') IS NOT NULL THEN
        DELETE FROM shardq_job_history;
    END IF;
END
$flush$;"""
        ]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
    creation_class = DatabaseCreation
