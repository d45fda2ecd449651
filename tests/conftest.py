"""Shared fixtures: real PostgreSQL only.

With DATABASE_URL unset the settings start the embedded server (pgserver);
pytest-django then creates the test database on whichever server it is.
"""

import pytest

from tests.helpers import wait_until  # noqa: F401 (older tests import it from here)


@pytest.fixture
def second_connection(django_db_blocker):
    """A separate autocommit psycopg connection to the test database (to hold locks)."""
    from shardq.db.store import connect

    with django_db_blocker.unblock():
        conn = connect()
    yield conn
    conn.close()


@pytest.fixture
def workers(tmp_path, transactional_db):
    """Real ``shardq_worker`` processes on the test database (tests/workers.py)."""
    from shardq.db.store import ensure_shards
    from tests.workers import WorkerPool

    ensure_shards()  # a transactional test's flush may have removed the rows
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()
