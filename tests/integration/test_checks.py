"""System checks (stable ids shardq.E001…) and a clean project."""

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import modify_settings, override_settings

from shardq.backend import ShardqBackend
from tests.taskapp.tasks import add

REPO = Path(__file__).resolve().parents[2]


def check_ids(backend=None) -> list[str]:
    backend = backend or add.get_backend()
    return [message.id for message in backend.check()]


def shardq_overridden(**changes):
    from django.conf import settings

    return override_settings(SHARDQ={**settings.SHARDQ, **changes})


def test_the_test_settings_pass_every_check():
    assert check_ids() == []


def test_a_database_that_is_not_postgresql_fails_e001(sqlite_alias):
    backend = ShardqBackend("lite_tasks", {"OPTIONS": {"DATABASE": sqlite_alias}})

    messages = list(backend.check())

    assert [m.id for m in messages] == ["shardq.E001"]
    assert "shardq needs PostgreSQL, but database 'lite' is sqlite" in messages[0].msg


def test_a_database_alias_that_is_not_configured_fails_e006():
    backend = ShardqBackend("other_tasks", {"OPTIONS": {"DATABASE": "other"}})

    messages = list(backend.check())

    assert [m.id for m in messages] == ["shardq.E006"]
    assert "'other' is not in DATABASES" in messages[0].msg


@pytest.mark.parametrize("count", [48, 0, -64, 32768, 64.0, True, "64"])
def test_a_shard_count_that_is_not_a_power_of_two_in_range_fails_e002(count):
    with shardq_overridden(SHARD_COUNT=count):
        assert check_ids() == ["shardq.E002"]


@pytest.mark.parametrize("count", [1, 2, 64, 1024, 16384])
def test_a_power_of_two_shard_count_passes(count):
    with shardq_overridden(SHARD_COUNT=count):
        assert check_ids() == []


@pytest.mark.parametrize(("heartbeat", "ttl"), [(15, 30), (20, 30), (30, 30), (0, 30), (10, 0), (-1, 30), ("10", 30)])
def test_a_heartbeat_that_is_not_below_half_the_lease_ttl_fails_e003(heartbeat, ttl):
    with shardq_overridden(HEARTBEAT=heartbeat, LEASE_TTL=ttl):
        assert check_ids() == ["shardq.E003"]


@pytest.mark.parametrize(("heartbeat", "ttl"), [(10, 30), (14.9, 30), (0.5, 2)])
def test_a_heartbeat_below_half_the_lease_ttl_passes(heartbeat, ttl):
    with shardq_overridden(HEARTBEAT=heartbeat, LEASE_TTL=ttl):
        assert check_ids() == []


@pytest.mark.parametrize("poll", [0, -1, "1"])
def test_a_poll_interval_that_is_not_positive_fails_e004(poll):
    with shardq_overridden(POLL_INTERVAL=poll):
        assert check_ids() == ["shardq.E004"]


@pytest.mark.parametrize("size", [0, -1, 1.5, "1024"])
def test_a_payload_limit_that_is_not_a_positive_int_fails_e005(size):
    with shardq_overridden(MAX_PAYLOAD_BYTES=size):
        assert check_ids() == ["shardq.E005"]


def test_manage_py_check_reports_shardq_errors_through_django():
    with shardq_overridden(SHARD_COUNT=48), pytest.raises(SystemCheckError, match=r"shardq\.E002"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_manage_py_check_is_clean_on_the_test_settings():
    out = StringIO()

    call_command("check", "--database", "default", stdout=out)

    assert "no issues" in out.getvalue()


@pytest.mark.process
def test_manage_py_check_is_clean_on_the_example_projects_settings():
    # DATABASE_URL is in the environment (the settings export the embedded
    # server's URL when it was unset), so the subprocess finds the same server.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"}

    completed = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True
    )

    assert completed.returncode == 0, completed.stderr
    assert "System check identified no issues" in completed.stdout


@pytest.mark.django_db
def test_the_models_and_migrations_agree():
    out = StringIO()

    call_command("makemigrations", "--check", "--dry-run", stdout=out)

    assert "No changes detected" in out.getvalue()


def test_a_shardq_backend_without_the_app_installed_fails_e009():
    with modify_settings(INSTALLED_APPS={"remove": ["shardq"]}):
        messages = list(add.get_backend().check())

    assert [m.id for m in messages] == ["shardq.E009"]
    assert "'shardq' is not in INSTALLED_APPS" in messages[0].msg
    assert "INSTALLED_APPS += ['shardq']" in messages[0].hint


def test_enqueue_without_the_app_installed_is_a_clear_error_and_stores_nothing():
    backend = ShardqBackend("default", {"QUEUES": []})  # a new backend: nothing validated yet

    with (
        modify_settings(INSTALLED_APPS={"remove": ["shardq"]}),
        pytest.raises(
            ImproperlyConfigured, match=r"'shardq' is not in INSTALLED_APPS.*INSTALLED_APPS \+= \['shardq'\]"
        ),
    ):
        backend.enqueue(add, (1, 2), {})


def test_enqueue_on_sqlite_is_a_clear_error(sqlite_alias):
    backend = ShardqBackend("default", {"QUEUES": [], "OPTIONS": {"DATABASE": sqlite_alias}})

    with pytest.raises(ImproperlyConfigured, match=r"shardq needs PostgreSQL, but database 'lite' is sqlite"):
        backend.enqueue(add, (1, 2), {})


@pytest.mark.parametrize(
    ("backend_path", "expected"),
    [("django.tasks.backends.immediate.ImmediateBackend", ["shardq.W001"]), ("shardq.backend.ShardqBackend", [])],
)
def test_the_app_installed_without_a_shardq_backend_warns_w001(backend_path, expected):
    from shardq.app_checks import app_without_backend

    with override_settings(TASKS={"default": {"BACKEND": backend_path}}):
        messages = app_without_backend()

    assert [m.id for m in messages] == expected


def test_manage_py_check_runs_the_w001_check_registered_by_the_app():
    with (
        override_settings(TASKS={"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}),
        pytest.raises(SystemCheckError, match=r"shardq\.W001"),
    ):
        call_command("check", "--fail-level", "WARNING", stdout=StringIO(), stderr=StringIO())


def test_a_misspelled_option_fails_e010_with_a_did_you_mean():
    backend = ShardqBackend("default", {"OPTIONS": {"DATABSE": "default", "UNIQUE_CACHE": 10}})

    messages = list(backend.check())

    assert [m.id for m in messages] == ["shardq.E010", "shardq.E010"]
    assert messages[0].msg == "TASKS['default']['OPTIONS'] has an unknown key 'DATABSE': did you mean 'DATABASE'?"
    assert "did you mean 'UNIQUE_CACHE_SIZE'?" in messages[1].msg
    assert "DATABASE, PREPARED_STATEMENTS, UNIQUE_CACHE_SIZE" in messages[0].hint


def test_misspelled_shardq_settings_fail_e011_with_a_did_you_mean():
    with shardq_overridden(LEASE_TLL=30, HEARTBAET=10, COLOUR="blue"):
        messages = list(add.get_backend().check())

    assert [m.id for m in messages] == ["shardq.E011"] * 3
    assert [m.msg for m in messages] == [
        "SHARDQ has an unknown key 'LEASE_TLL': did you mean 'LEASE_TTL'?",
        "SHARDQ has an unknown key 'HEARTBAET': did you mean 'HEARTBEAT'?",
        "SHARDQ has an unknown key 'COLOUR'.",
    ]


def test_queue_limits_in_shardq_settings_pass_the_checks():
    # docs/limits.md's own example: a worker refused to start with it (E011).
    with shardq_overridden(QUEUES={"emails": {"max_concurrency": 20, "rate_limit": "50/s"}}):
        messages = list(add.get_backend().check())
        call_command("check", stdout=StringIO(), stderr=StringIO())

    assert messages == []


def test_manage_py_check_reports_a_misspelled_setting():
    with shardq_overridden(LEASE_TLL=30), pytest.raises(SystemCheckError, match=r"did you mean 'LEASE_TTL'"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


def test_a_task_on_a_queue_its_backend_lacks_names_the_task_and_the_configured_queues():
    from django.tasks.exceptions import InvalidTask

    tasks = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["default", "emails"]}}

    with override_settings(TASKS=tasks), pytest.raises(InvalidTask) as raised:
        add.using(queue_name="emials")

    assert str(raised.value) == (
        "Task tests.taskapp.tasks.add has queue_name 'emials', which is not in "
        "TASKS['default']['QUEUES'] = ['default', 'emails']: use one of those queues, or add this one to QUEUES."
    )


@pytest.mark.parametrize("queues", [{"emials": {"max_concurrency": 2}}, ["emials"]])
def test_shardq_queues_naming_a_queue_no_backend_has_fails_e013(queues):
    from shardq.app_checks import queues_no_backend_has

    tasks = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["default", "emails"]}}
    with override_settings(TASKS=tasks), shardq_overridden(QUEUES=queues):
        messages = queues_no_backend_has()

    assert [m.id for m in messages] == ["shardq.E013"]
    assert messages[0].msg == (
        "SHARDQ['QUEUES'] names the queue 'emials', which no shardq backend has "
        "(TASKS['default']['QUEUES'] = ['default', 'emails']): did you mean 'emails'?"
    )


def test_shardq_queues_are_fine_when_a_backend_has_them_or_allows_any_name():
    from shardq.app_checks import queues_no_backend_has

    listed = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["default", "emails"]}}
    any_name = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": []}}
    for tasks in (listed, any_name):
        with override_settings(TASKS=tasks), shardq_overridden(QUEUES={"emails": {"max_concurrency": 2}}):
            assert queues_no_backend_has() == []


def test_manage_py_check_runs_e013():
    tasks = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["default"]}}
    with (
        override_settings(TASKS=tasks),
        shardq_overridden(QUEUES=["emails"]),
        pytest.raises(SystemCheckError, match=r"shardq\.E013"),
    ):
        call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.process
def test_manage_py_check_reports_the_missing_app_in_a_real_project(tmp_path):
    # A new project whose URLconf imports a view that enqueues a task on
    # shardq's backend, with "shardq" left out of INSTALLED_APPS: the check
    # list is fixed before the URL check imports the task, so only the
    # task's definition can report it.
    python = [sys.executable, "-m", "django"]
    subprocess.run([*python, "startproject", "mysite", tmp_path], check=True)
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "__init__.py").write_text("")
    (shop / "tasks.py").write_text("from django.tasks import task\n\n\n@task\ndef add(a, b):\n    return a + b\n")
    (shop / "views.py").write_text(
        "from django.http import HttpResponse\n\nfrom .tasks import add\n\n\n"
        "def index(request):\n    return HttpResponse(add.enqueue(1, 2).id)\n"
    )
    (tmp_path / "mysite" / "urls.py").write_text(
        "from django.urls import path\n\nfrom shop import views\n\nurlpatterns = [path('', views.index)]\n"
    )
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(
        settings.read_text()
        + "\nINSTALLED_APPS += ['shop']\n"
        + "DATABASES = {'default': {'ENGINE': 'django.db.backends.postgresql', 'NAME': 'unused'}}\n"
        + "TASKS = {'default': {'BACKEND': 'shardq.backend.ShardqBackend'}}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}

    completed = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=tmp_path, env=env, capture_output=True, text=True
    )

    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "(shardq.E009) TASKS['default'] uses shardq's backend, but 'shardq' is not in INSTALLED_APPS" in (
        completed.stderr
    )
    assert "INSTALLED_APPS += ['shardq']" in completed.stderr
    assert "Traceback" not in completed.stderr
