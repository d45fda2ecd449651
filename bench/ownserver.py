"""A PostgreSQL cluster of a bench's own, for the benches that measure the
server too or must not share it (tests/pgserver.py ``PrivatePostgres``).

    with own_server("pickup", "shardq_pickup", statements=True, migrate=True) as server:
        ...  # DATABASE_URL is server.url

The server runs at the priority of the process that starts it: start the
bench under ``nice -n -10`` on a shared machine. ``fsync`` is off unless
``settings`` turn it on (tests/pgserver.py's default).
"""

import contextlib
import os
from collections.abc import Iterator

from tests.pgserver import PrivatePostgres

# pg_stat_statements loaded, planning time tracked: a bench that prints the
# statements by server time.
STATEMENTS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.track_planning": "on",
}


@contextlib.contextmanager
def own_server(
    prefix: str,
    database: str = "postgres",
    settings: dict[str, str] | None = None,
    *,
    statements: bool = False,
    migrate: bool = False,
) -> Iterator[PrivatePostgres]:
    """Start a cluster (``shared_buffers`` 256MB, then ``settings``), create
    ``database`` in it, point DATABASE_URL (and, when unset,
    DJANGO_SETTINGS_MODULE: the test settings) at it; with ``statements``
    pg_stat_statements is loaded and created, with ``migrate`` shardq's
    migrations are applied. The cluster is removed on exit."""
    server = PrivatePostgres(
        prefix, database, settings={"shared_buffers": "256MB", **(STATEMENTS if statements else {}), **(settings or {})}
    )
    server.init()
    server.start()
    try:
        if database != "postgres":
            server.createdb()
        os.environ["DATABASE_URL"] = server.url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
        if migrate:
            from bench import e2e

            e2e.migrate(server.url)
        if statements:
            import psycopg

            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield server
    finally:
        server.destroy()


def postmaster_pid(server: PrivatePostgres) -> int:
    """The pid of the cluster's postmaster (bench/cpu.py ``cluster_cpu`` reads its processes)."""
    return int((server.data / "postmaster.pid").read_text().split()[0])
