"""Under Django's default logging with DEBUG, Django's own task lines
(``django.tasks``) are printed by the worker in its format (time, level,
pid, logger), not bare between its timed lines; without DEBUG they stay
unbuilt, and a failure still reaches ``mail_admins``."""

import logging
import logging.config
import re

import pytest
from django.utils.log import DEFAULT_LOGGING

from shardq.dispatch import record_is_seen
from shardq.worker import logs

NAMES = ("", "django", "django.server", "django.tasks")


@pytest.fixture
def default_logging():
    """Configures Django's DEFAULT_LOGGING as a project without LOGGING has
    it, with no root handler (pytest's own, added for the test's call, are
    set aside); everything is restored afterwards."""
    saved = {
        name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled)
        for name, lg in ((n, logging.getLogger(n)) for n in NAMES)
    }

    def configure():
        logging.getLogger().handlers = []
        logging.config.dictConfig(DEFAULT_LOGGING)

    try:
        yield configure
    finally:
        for name, (handlers, level, propagate, disabled) in saved.items():
            lg = logging.getLogger(name)
            lg.handlers, lg.level, lg.propagate, lg.disabled = handlers, level, propagate, disabled


def test_under_debug_djangos_task_lines_carry_the_workers_time_and_format(default_logging, settings, capsys):
    settings.DEBUG = True
    default_logging()
    logs.tidy_django_task_log()

    logging.getLogger("django.tasks").info("Task id=7 path=shop.tasks.add state=RUNNING")

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO \[\d+\] django\.tasks: Task id=7 path=shop\.tasks\.add state=RUNNING",
        lines[0],
    ), lines


def test_without_debug_task_lines_stay_unbuilt_and_failures_still_reach_mail_admins(default_logging, settings, capsys):
    settings.DEBUG = False
    default_logging()
    logs.tidy_django_task_log()
    tasks_logger = logging.getLogger("django.tasks")

    assert not record_is_seen(tasks_logger, logging.INFO)
    assert record_is_seen(tasks_logger, logging.ERROR)
    assert "mail_admins" in {h.get_name() for h in tasks_logger.handlers}
    tasks_logger.info("Task id=7 state=SUCCESSFUL")
    assert capsys.readouterr().err == ""


def test_a_project_that_configures_django_tasks_is_left_alone(default_logging):
    default_logging()
    own = logging.StreamHandler()
    logging.getLogger("django.tasks").addHandler(own)

    logs.tidy_django_task_log()

    assert logging.getLogger("django.tasks").handlers == [own]
    assert logging.getLogger("django.tasks").propagate
