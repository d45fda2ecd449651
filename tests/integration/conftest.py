"""Fixtures of the integration tests: real PostgreSQL, read back with plain SQL."""

import contextlib

import pytest
from django.db import connections
from django.tasks import task_backends
from django.test import override_settings

from tests.helpers import scalar, sql


def job_count() -> int:
    return scalar("SELECT count(*) FROM shardq_job")


def execute(statement: str, params=None) -> None:
    sql(statement, params)


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
