"""Fixtures of the integration tests: real PostgreSQL, read back with plain SQL."""

import contextlib
import json

import pytest
from django.db import connection, connections
from django.tasks import task_backends
from django.test import override_settings

JSON_COLUMNS = {"args", "kwargs", "return_value", "errors", "worker_ids"}


def job_row(job_id) -> dict | None:
    """The ``shardq_job`` row of a job id, as a dict (None when there is none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM shardq_job WHERE id = %s", [int(job_id)])
        row = cursor.fetchone()
        if row is None:
            return None
        names = [c.name for c in cursor.description]
    # Django's cursor hands jsonb back as text.
    return {
        name: json.loads(value) if name in JSON_COLUMNS and value is not None else value
        for name, value in zip(names, row, strict=True)
    }


def job_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shardq_job")
        return cursor.fetchone()[0]


def execute(sql: str, params=None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def reset_task_backends() -> None:
    # ShardqBackend reads settings.SHARDQ when it is built; django.tasks only
    # rebuilds its backends when TASKS changes, so drop them by hand.
    from asgiref.local import Local

    task_backends._connections = Local()


@pytest.fixture
def shardq_settings():
    """``with shardq_settings(MAX_PAYLOAD_BYTES=100): ...`` — SHARDQ overridden and
    the task backends rebuilt on entry and on exit."""
    from django.conf import settings

    @contextlib.contextmanager
    def override(**changes):
        try:
            with override_settings(SHARDQ={**settings.SHARDQ, **changes}):
                reset_task_backends()
                yield
        finally:
            reset_task_backends()

    return override


@pytest.fixture
def sqlite_alias():
    """A second database alias, ``lite``, on SQLite (in memory) — never migrated."""
    alias = "lite"
    configured = connections.configure_settings(
        {"default": {}, alias: {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    )
    connections.settings[alias] = configured[alias]
    try:
        yield alias
    finally:
        if hasattr(connections._connections, alias):
            connections[alias].close()
            delattr(connections._connections, alias)
        del connections.settings[alias]
