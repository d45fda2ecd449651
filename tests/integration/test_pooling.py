"""Transaction pools (issue 28 §3, shardq/pooling.py): the checks and
defaults that keep a worker off a transaction pool and the web side's
enqueue working through one. The pool itself: tests/acceptance/test_pgbouncer.py."""

import copy

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections
from django.tasks import task_backends
from django.test import override_settings

from shardq.backend import ShardqBackend
from shardq.checks import backend_checks


@pytest.fixture
def pooled_default(monkeypatch):
    """DATABASES["default"] marked as Django asks for a transaction pool, and
    a "direct" alias beside it."""
    monkeypatch.setitem(connections.settings["default"], "DISABLE_SERVER_SIDE_CURSORS", True)
    direct = copy.deepcopy(connections.settings["default"])
    direct["DISABLE_SERVER_SIDE_CURSORS"] = False
    monkeypatch.setitem(connections.settings, "direct", direct)


def ids(messages):
    return [m.id for m in messages]


def test_a_worker_that_would_listen_through_a_transaction_pool_is_warned(pooled_default):
    [warning] = [m for m in backend_checks(task_backends["default"]) if m.id == "shardq.W020"]
    assert "shardq_worker connects through 'default'" in warning.msg
    assert "DISABLE_SERVER_SIDE_CURSORS" in warning.msg and "LISTEN" in warning.msg
    assert "SHARDQ['WORKER_DATABASE']" in warning.hint
    with override_settings(SHARDQ={**settings.SHARDQ, "WORKER_DATABASE": "direct"}):
        assert "shardq.W020" not in ids(backend_checks(task_backends["default"]))


def test_pgbouncer_s_port_is_taken_for_a_pool(monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "PORT", "6432")
    [warning] = [m for m in backend_checks(task_backends["default"]) if m.id == "shardq.W020"]
    assert "connects to port 6432, PgBouncer's" in warning.msg


def test_a_direct_database_draws_no_warning():
    assert "shardq.W020" not in ids(backend_checks(task_backends["default"]))


def test_a_worker_database_that_is_not_an_alias_is_an_error_for_the_check_and_the_worker():
    with override_settings(SHARDQ={**settings.SHARDQ, "WORKER_DATABASE": "replica"}):
        [error] = [m for m in backend_checks(task_backends["default"]) if m.id == "shardq.E020"]
        assert error.msg == "SHARDQ['WORKER_DATABASE'] = 'replica' is not in DATABASES."
        with pytest.raises(CommandError, match=r"SHARDQ\['WORKER_DATABASE'\] = 'replica' is not in DATABASES"):
            call_command("shardq_worker")


def test_the_enqueue_prepares_nothing_behind_a_transaction_pool_unless_told_to(pooled_default):
    config = {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["default"]}
    assert ShardqBackend("pooled", config).prepared_statements is False
    assert ShardqBackend("pooled", {**config, "OPTIONS": {"PREPARED_STATEMENTS": True}}).prepared_statements is True
    direct = {**config, "OPTIONS": {"DATABASE": "direct"}}
    assert ShardqBackend("direct", direct).prepared_statements is True
