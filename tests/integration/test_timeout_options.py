"""``timeout`` on a task (``@shard_task``, Django's ``@task``, ``.using()``)
and the run-control settings: validated when defined, with clear errors."""

import math
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task
from django.tasks.exceptions import InvalidTask

from shardq import shard_task
from tests.integration.test_checks import check_ids, shardq_overridden


def define(**options):
    def body(n: int) -> None: ...

    body.__module__ = "tests.taskapp.tasks"
    body.__qualname__ = "body"  # as if defined at module level
    return shard_task(**options)(body)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (-1, "positive"),
        (0, "positive"),
        (float("nan"), "positive"),
        (timedelta(seconds=-5), "positive"),
        (True, "not True (bool)"),
        ("30", "not '30' (str)"),
        ([30], "not [30] (list)"),
    ],
)
def test_a_bad_timeout_is_refused_when_the_task_is_defined(value, words):
    with pytest.raises(InvalidTask, match="timeout must be") as caught:
        define(timeout=value)
    assert words in str(caught.value)
    assert "tests.taskapp.tasks.body" in str(caught.value)


def test_timeout_in_seconds_or_a_timedelta_and_inf_for_no_limit():
    assert define(timeout=2.5).timeout_seconds == 2.5
    assert define(timeout=timedelta(minutes=1)).timeout_seconds == 60.0
    assert define(timeout=math.inf).timeout_seconds is None
    assert define().timeout_seconds is None  # the default: SHARDQ["TASK_TIMEOUT"] = None


def test_djangos_task_decorator_and_using_accept_timeout():
    def body() -> None: ...

    body.__module__ = "tests.taskapp.tasks"
    body.__qualname__ = "body"  # as if defined at module level
    plain = task(timeout=3)(body)
    assert plain.timeout_seconds == 3.0
    assert plain.using(timeout=7).timeout_seconds == 7.0
    assert plain.using(priority=5).timeout_seconds == 3.0
    with pytest.raises(InvalidTask, match="timeout must be a positive number"):
        plain.using(timeout=-1)


def test_the_default_comes_from_the_setting_and_a_task_overrides_it():
    with shardq_overridden(TASK_TIMEOUT=45):
        assert define().timeout_seconds == 45.0
        assert define(timeout=5).timeout_seconds == 5.0
        assert define(timeout=math.inf).timeout_seconds is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("TASK_TIMEOUT", -3),
        ("TASK_TIMEOUT", "10"),
        ("TASK_TIMEOUT", float("nan")),
        ("MAX_ZOMBIES", -1),
        ("MAX_ZOMBIES", 1.5),
        ("MAX_ZOMBIES", True),
        ("ZOMBIE_GRACE", 0),
        ("ZOMBIE_GRACE", float("inf")),
    ],
)
def test_a_bad_run_control_setting_fails_e012_and_a_task_definition(key, value):
    with shardq_overridden(**{key: value}):
        assert "shardq.E012" in check_ids()
        if key == "TASK_TIMEOUT":
            with pytest.raises(ImproperlyConfigured, match=r"SHARDQ\['TASK_TIMEOUT'\]"):
                define()


def test_good_run_control_settings_pass_the_checks():
    with shardq_overridden(TASK_TIMEOUT=timedelta(minutes=5), MAX_ZOMBIES=0, ZOMBIE_GRACE=60):
        assert "shardq.E012" not in check_ids()
