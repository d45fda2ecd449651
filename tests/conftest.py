"""Shared fixtures: real PostgreSQL only.

With DATABASE_URL unset the settings start the embedded server (pgserver);
pytest-django then creates the test database on whichever server it is.
"""

import time

import pytest


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = ""):
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            what = message() if callable(message) else (message or predicate)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


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
