"""SignalGate: a signal is skipped only when sending it could have no effect."""

import logging

import pytest
from django.tasks.signals import log_task_enqueued, task_enqueued

from shardq.dispatch import SignalGate
from tests.taskapp.tasks import add


@pytest.fixture
def quiet_tasks_logger():
    logger = logging.getLogger("django.tasks")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield logger
    logger.setLevel(level)


def test_only_djangos_own_receiver_and_a_quiet_logger_means_not_needed(quiet_tasks_logger):
    gate = SignalGate(task_enqueued, log_task_enqueued)
    assert gate.needed(logging.DEBUG) is False
    assert gate.needed(logging.ERROR) is True  # the logger would log at ERROR


def test_any_other_receiver_makes_the_signal_needed_until_it_is_disconnected(quiet_tasks_logger):
    gate = SignalGate(task_enqueued, log_task_enqueued)

    def receiver(sender, task_result, **kwargs):
        pass

    task_enqueued.connect(receiver)
    try:
        assert gate.needed(logging.DEBUG) is True
    finally:
        task_enqueued.disconnect(receiver)
    assert gate.needed(logging.DEBUG) is False


def test_a_logger_at_debug_makes_the_enqueued_signal_needed(quiet_tasks_logger):
    gate = SignalGate(task_enqueued, log_task_enqueued)
    quiet_tasks_logger.setLevel(logging.DEBUG)
    assert gate.needed(logging.DEBUG) is True


@pytest.mark.django_db
def test_enqueue_logs_through_djangos_receiver_when_the_logger_is_at_debug(quiet_tasks_logger, caplog):
    quiet_tasks_logger.setLevel(logging.DEBUG)
    with caplog.at_level(logging.DEBUG, logger="django.tasks"):
        result = add.enqueue(1, 2)
    assert f"Task id={result.id} path=tests.taskapp.tasks.add enqueued" in caplog.text
