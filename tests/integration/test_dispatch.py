"""SignalGate: a signal is skipped only when sending it could have no effect:
no receiver but Django's own, whose log record nothing would see."""

import io
import itertools
import logging

import pytest
from django.tasks.signals import log_task_enqueued, task_enqueued
from django.test import override_settings
from django.utils.log import AdminEmailHandler, RequireDebugFalse, RequireDebugTrue

from shardq.dispatch import RECHECK_SECONDS, LogVerdicts, SignalGate, record_is_seen
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


def test_a_receiver_connected_in_place_of_djangos_own_is_noticed(quiet_tasks_logger):
    gate = SignalGate(task_enqueued, log_task_enqueued)
    assert gate.needed(logging.DEBUG) is False

    def receiver(sender, task_result, **kwargs):
        pass

    task_enqueued.disconnect(log_task_enqueued)
    task_enqueued.connect(receiver)
    try:
        # As many receivers as before, but another one.
        assert gate.needed(logging.DEBUG) is True
    finally:
        task_enqueued.disconnect(receiver)
        task_enqueued.connect(log_task_enqueued)
    assert gate.needed(logging.DEBUG) is False


# -- would a record reach anything? (Django's DEFAULT_LOGGING, built apart from
# the process's own logging tree so the test changes nothing global)


_names = itertools.count()


def default_logging_chain() -> logging.Logger:
    """``django.tasks`` under a ``django`` logger with DEFAULT_LOGGING's
    handlers (console: INFO, RequireDebugTrue; mail_admins: ERROR,
    RequireDebugFalse), under a root with no handler."""
    root = logging.RootLogger(logging.WARNING)
    django_logger = logging.Logger("django", logging.INFO)
    django_logger.parent = root
    console = logging.StreamHandler(io.StringIO())
    console.setLevel(logging.INFO)
    console.addFilter(RequireDebugTrue())
    mail_admins = AdminEmailHandler()
    mail_admins.setLevel(logging.ERROR)
    mail_admins.addFilter(RequireDebugFalse())
    django_logger.addHandler(console)
    django_logger.addHandler(mail_admins)
    # Registered with logging's manager (so setLevel clears its level cache)
    # under a name of its own, then hung under the private chain.
    tasks_logger = logging.getLogger(f"tests.dispatch.{next(_names)}.django.tasks")
    tasks_logger.parent = django_logger
    return tasks_logger


def test_with_djangos_default_logging_an_info_record_reaches_a_handler_only_with_debug(settings):
    logger = default_logging_chain()
    settings.DEBUG = False
    assert logger.isEnabledFor(logging.INFO)  # enabled, yet every handler drops it
    assert record_is_seen(logger, logging.INFO) is False
    assert record_is_seen(logger, logging.ERROR) is True  # mail_admins
    settings.DEBUG = True
    assert record_is_seen(logger, logging.INFO) is True  # console
    assert record_is_seen(logger, logging.ERROR) is True
    assert record_is_seen(logger, logging.DEBUG) is False  # the logger is at INFO


def test_an_unknown_filter_or_handler_counts_as_seeing_the_record(settings):
    settings.DEBUG = False
    logger = default_logging_chain()
    logger.parent.handlers[0].filters.insert(0, lambda record: True)  # before RequireDebugTrue
    assert record_is_seen(logger, logging.INFO) is True

    class Custom(logging.Handler):
        def handle(self, record):  # may not look at its filters at all
            return True

    logger = default_logging_chain()
    handler = Custom()
    handler.addFilter(RequireDebugTrue())
    logger.addHandler(handler)
    assert record_is_seen(logger, logging.INFO) is True


def test_a_filter_on_the_logger_itself_sees_every_record_it_is_enabled_for(settings):
    settings.DEBUG = False
    logger = default_logging_chain()
    logger.addFilter(lambda record: True)
    assert record_is_seen(logger, logging.INFO) is True


def test_null_handlers_propagation_and_the_last_resort():
    root = logging.RootLogger(logging.DEBUG)
    logger = logging.Logger("django.tasks")
    logger.parent = root
    # No handler anywhere: logging's last resort prints WARNING and above.
    assert record_is_seen(logger, logging.INFO) is False
    assert record_is_seen(logger, logging.WARNING) is True
    logger.addHandler(logging.NullHandler())
    assert record_is_seen(logger, logging.WARNING) is False
    root.addHandler(logging.StreamHandler(io.StringIO()))
    assert record_is_seen(logger, logging.INFO) is True
    logger.propagate = False
    assert record_is_seen(logger, logging.INFO) is False
    logger.disabled = True
    assert record_is_seen(logger, logging.ERROR) is False


def test_verdicts_are_kept_and_taken_again_when_a_change_is_cheap_to_notice(settings):
    settings.DEBUG = False
    logger = default_logging_chain()
    now = [100.0]
    verdicts = LogVerdicts(logger, clock=lambda: now[0])
    assert verdicts.seen(logging.INFO) is False
    # A handler added at run time: kept until the recheck.
    extra = logging.StreamHandler(io.StringIO())
    logger.addHandler(extra)
    assert verdicts.seen(logging.INFO) is False
    now[0] += RECHECK_SECONDS
    assert verdicts.seen(logging.INFO) is True
    logger.removeHandler(extra)
    # DEBUG changed (setting_changed): at once.
    with override_settings(DEBUG=True):
        assert verdicts.seen(logging.INFO) is True
    assert verdicts.seen(logging.INFO) is False
    # The logger enabled for the level again (setLevel, caplog.at_level): at once.
    logger.setLevel(logging.WARNING)
    assert verdicts.seen(logging.INFO) is False
    logger.addHandler(extra)
    logger.setLevel(logging.INFO)
    assert verdicts.seen(logging.INFO) is True
