"""The wheel is the library.

Builds shardq's wheel from a copy of the checkout, installs it into a fresh
virtualenv (its declared dependencies only: no rich, no django-environ, no
binary psycopg) beside a new ``django-admin startproject`` project that adds
``shardq`` to ``INSTALLED_APPS`` and uses shardq's backend, then runs that
project's ``manage.py``: it offers exactly shardq's commands, each of them
runs, and ``shardq_status`` answers from a database of its own.
"""

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.packaging.wheels import (
    admin_connection,
    dependency_closure,
    link_dependencies,
    run,
    server_settings,
    wheel_metadata,
)

COMMANDS = {"shardq_worker", "shardq_status", "shardq_prune", "shardq_reshard", "shardq_queue", "shardq_jobs"}
# What `shardq/` imports, and nothing else, is required unconditionally.
REQUIRED = {"django", "psycopg", "mmh3", "sortedcontainers", "croniter"}
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def database():
    server = server_settings()
    name = f"shardq_wheel_{os.getpid()}"
    with admin_connection(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {**server, "NAME": name}
    with admin_connection(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def project(wheel, database, tmp_path_factory):
    """A fresh venv with the wheel installed, and a new project that uses it."""
    root = tmp_path_factory.mktemp("user")
    env_dir = root / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", env_dir)
    python = env_dir / "bin" / "python"
    # The wheel's declared dependencies, linked from this environment; pip
    # then finds them installed and only installs the wheel (and would fail
    # on a requirement the closure does not meet).
    deps = root / "deps"
    link_dependencies(dependency_closure(wheel_metadata(wheel).get_all("Requires-Dist")), deps)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    (Path(site) / "shardq-test-deps.pth").write_text(f"{deps}\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-index", wheel)
    run(sys.executable, "-m", "pip", "--python", python, "check")
    (root / "mysite").mkdir()
    run(python, "-m", "django", "startproject", "mysite", root / "mysite")
    settings = root / "mysite" / "mysite" / "settings.py"
    db = {"ENGINE": "django.db.backends.postgresql", **database}
    settings.write_text(
        settings.read_text()
        + (
            "\nINSTALLED_APPS += ['shardq']\n"
            "TASKS = {'default': {'BACKEND': 'shardq.backend.ShardqBackend'}}\n"
            f"DATABASES = {{'default': {db!r}}}\n"
        )
    )
    # Nothing of the checkout or the test run may leak into the user's project.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV", "SHARDQ_PGDATA"}
    }

    def manage(*args, check=True):
        return run(python, "manage.py", *args, cwd=root / "mysite", env=env, check=check)

    manage.python, manage.root, manage.env, manage.database = python, root, env, database
    manage("migrate", "shardq", "--verbosity", "0")
    return manage


def test_the_wheel_holds_only_the_library_and_its_type_marker(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {name.split("/")[0] for name in names} == {"shardq", dist_info}
    assert "shardq/py.typed" in names
    # Every file of named SQL (one a table): the loader reads them all.
    sql = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "shardq" / "db" / "sql").glob("*.sql"))
    assert len(sql) > 1 and set(sql) <= set(names), sorted(set(sql) - set(names))
    assert "shardq/db/testing.sql" in names
    assert "shardq/templates/admin/shardq/dashboard.html" in names and "shardq/static/shardq/admin.css" in names
    assert not [n for n in names if n.startswith(("example_project/", "bench/", "tests/"))]
    assert not [n for n in names if "shardq_demo" in n or "shardq_bench" in n]


def test_the_wheel_requires_only_what_shardq_imports(wheel):
    meta = wheel_metadata(wheel)
    unconditional = set()
    for requirement in meta.get_all("Requires-Dist"):
        if "extra ==" not in requirement:
            unconditional.add(requirement.split(";")[0].split("[")[0].split(">")[0].split("<")[0].strip().lower())
            assert "[binary]" not in requirement, requirement
    assert unconditional == REQUIRED
    assert "rich" in meta.get_all("Provides-Extra")
    assert meta["License-Expression"] == "BSD-3-Clause"


def test_manage_py_help_lists_exactly_shardqs_commands(project):
    out = project("help").stdout
    section = out.split("[shardq]", 1)[1].split("\n\n", 1)[0]
    assert {line.strip() for line in section.splitlines() if line.strip()} == COMMANDS
    assert "shardq_demo" not in out and "shardq_bench" not in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_answers_help(project, command):
    assert "usage:" in project(command, "--help").stdout


def test_status_and_prune_run_against_a_real_database_without_rich(project):
    has_rich = "import importlib.util, sys; sys.exit(importlib.util.find_spec('rich') is not None)"
    no_rich = run(project.python, "-c", has_rich, env=project.env, check=False)
    assert no_rich.returncode == 0, "rich is installed in the user's venv: the plain-text fallback goes untested"
    status = json.loads(project("shardq_status", "--json").stdout)
    assert status["jobs"] == {} and status["workers"] == []
    assert "would delete" in project("shardq_prune", "--dry-run").stdout
    assert "deleted 0 jobs" in project("shardq_prune").stdout
    assert "would raise the shard count from 64 to 128" in project("shardq_reshard", "--to", "128", "--dry-run").stdout


def test_the_embedded_data_dir_is_the_projects_not_site_packages(project):
    code = "from shardq import embedded; print(embedded.data_dir())"
    path = project("shell", "-c", code).stdout.strip().splitlines()[-1]
    assert "site-packages" not in path
    assert path == str(project.root / "mysite" / ".pgdata") or "shardq-pg-" in path
    bare = run(project.python, "-c", code, env=project.env, check=False)
    assert bare.returncode != 0 and "SHARDQ_PGDATA" in bare.stderr


def test_the_worker_starts_holds_shards_and_stops_on_sigterm(project):
    log_path = project.root / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [project.python, "manage.py", "shardq_worker", "--concurrency", "1", "--grace", "5"],
            cwd=project.root / "mysite",
            env=project.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with admin_connection(project.database, project.database["NAME"]) as conn:

            def holds_a_shard() -> bool:
                assert worker.poll() is None, f"shardq_worker exited {worker.returncode}:\n{log_path.read_text()}"
                return conn.execute(
                    "SELECT count(*) FROM shardq_shard s JOIN shardq_worker w ON w.id = s.owner "
                    "WHERE w.state = 'RUNNING' AND s.lease_expires > clock_timestamp()"
                ).fetchone()[0]

            wait_until(holds_a_shard, timeout=90, interval=0.2, message="shardq_worker to take a shard")
        os.killpg(worker.pid, signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
