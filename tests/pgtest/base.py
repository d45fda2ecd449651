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

After a flush Django's post_migrate writes the content types and permissions
back (about 0.9 s of ORM inserts a test under load, more than the TRUNCATE
itself once that was gone). ``keep_post_migrate_rows()``, called once the
test database is migrated (tests/conftest.py), copies those two tables into
the schema ``pgtest``; the DELETE path puts them back as they were, so the
post_migrate that follows finds every row present and inserts nothing. The
rows are the ones post_migrate would write (the same content types and
permissions; their ids are the first ones it wrote rather than new ones).

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
#: The tables post_migrate fills, kept in the schema ``pgtest`` after migrate
#: and put back by the DELETE path (parents first).
KEPT_TABLES = ("django_content_type", "auth_permission")


def keep_post_migrate_rows(connection) -> None:
    """Copy ``KEPT_TABLES`` as the migrated test database holds them into
    the schema ``pgtest`` (not on the search path, and no model's table)."""
    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA IF EXISTS pgtest CASCADE")
        cursor.execute("CREATE SCHEMA pgtest")
        for table in KEPT_TABLES:
            name = connection.ops.quote_name(table)
            cursor.execute(f"CREATE TABLE pgtest.{name} AS TABLE public.{name}")


def _text_array(names: list[str]) -> str:
    return "ARRAY[" + ", ".join("'" + name.replace("'", "''") + "'" for name in names) + "]::text[]"


class DatabaseOperations(operations.DatabaseOperations):
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
        FOREACH name IN ARRAY {_text_array(list(KEPT_TABLES))} LOOP
            IF name = ANY (flushed) AND to_regclass(format('pgtest.%I', name)) IS NOT NULL THEN
                EXECUTE format('INSERT INTO %I SELECT * FROM pgtest.%I', name, name);
            END IF;
        END LOOP;
    END IF;
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
