"""README.md's "Install" and "Use", run as a newcomer would.

The code blocks of README.md marked ``<!-- readme-test: NAME -->`` are read
from the README itself, never copied here, and run as written: in a fresh
virtualenv, from a freshly built wheel (in ``dist/``, where the README's
``pip install`` looks), in a new ``django-admin startproject``. The job the
README enqueues must be run by a real ``shardq_worker``, the admin page the
README names must render, styled, for the superuser it creates, and the
README's test (``shardq.testing``) must pass under ``manage.py test``. A step that
stops working fails this test.

What the test adds, and only that:

- the machine: a PostgreSQL database of its own, named to the project through
  libpq's ``PG*`` variables (which the README's settings read), and the
  wheel's dependencies linked from this environment with ``PIP_NO_INDEX=1``
  (pip finds them installed and downloads nothing);
- ``cd`` between lines is followed; the blocks' long-running commands
  (``shardq_worker``, ``runserver``) run in the background, ``runserver``
  on a free port; ``createsuperuser`` runs with ``--noinput`` and Django's
  ``DJANGO_SUPERUSER_*`` variables instead of a terminal.
"""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import wait_until
from tests.packaging.wheels import (
    REPO,
    admin_connection,
    dependency_closure,
    link_dependencies,
    run,
    server_settings,
    wheel_metadata,
)

pytestmark = pytest.mark.timeout(420)

MARKED = re.compile(r"<!-- readme-test: (?P<name>[\w-]+) -->\s*```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)
BACKGROUND = ("shardq_worker", "runserver")
SUPERUSER = {
    "DJANGO_SUPERUSER_USERNAME": "admin",
    "DJANGO_SUPERUSER_PASSWORD": "readme-pass-1",
    "DJANGO_SUPERUSER_EMAIL": "a@example.com",
}


def readme_blocks() -> dict[str, str]:
    blocks = {m["name"]: m["code"] for m in MARKED.finditer((REPO / "README.md").read_text())}
    expected = {"install", "project", "settings", "tasks", "migrate", "worker", "enqueue", "admin", "tests", "test"}
    assert expected <= blocks.keys(), f"README.md lost marked blocks: {sorted(expected - blocks.keys())}"
    return blocks


def command_lines(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Newcomer:
    """A shell in a fresh virtualenv that follows the README line by line."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.cwd = root
        self.env = env
        self.root = root
        self.background: list[subprocess.Popen] = []

    def shell(self, block: str) -> None:
        for line in command_lines(block):
            words = shlex.split(line, comments=True)
            if words[0] == "cd":
                self.cwd = self.cwd / words[1]
            elif any(word in BACKGROUND for word in words):
                raise AssertionError(f"{line!r} runs until stopped: start it with start()")
            else:
                if "createsuperuser" in words:
                    line += " --noinput"
                done = subprocess.run(
                    ["bash", "-c", line], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=240
                )
                assert done.returncode == 0, (
                    f"README step {line!r} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
                )

    def start(self, line: str, *extra: str) -> subprocess.Popen:
        log = open(self.root / f"{len(self.background)}.log", "w")  # noqa: SIM115 (closed by stop_all)
        proc = subprocess.Popen(
            [*shlex.split(line, comments=True), *extra],
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log_path, proc.log_file = Path(log.name), log
        self.background.append(proc)
        return proc

    def python(self, code: str) -> str:
        """``python manage.py shell -c CODE`` in the project: its stdout."""
        done = subprocess.run(
            ["python", "manage.py", "shell", "-c", code],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, f"manage.py shell exited {done.returncode}:\n{code}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def stop_all(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            proc.log_file.close()


@pytest.fixture
def database():
    server = server_settings()
    name = f"shardq_readme_{os.getpid()}"
    with admin_connection(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {**server, "NAME": name}
    with admin_connection(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def newcomer(wheel, database, tmp_path):
    blocks = readme_blocks()
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    # What the wheel and the README's `pip install` line require, linked from
    # this environment into the new venv's path: pip finds it installed.
    (install,) = command_lines(blocks["install"])
    named = [word for word in shlex.split(install, comments=True)[2:] if not word.startswith(("-", "dist/"))]
    requirements = [*wheel_metadata(wheel).get_all("Requires-Dist"), *named]
    deps = tmp_path / "deps"
    link_dependencies(dependency_closure(requirements), deps)
    site = run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout
    (Path(site.strip()) / "readme-test-deps.pth").write_text(f"{deps}\n")
    home = tmp_path / "home"
    (home / "dist").mkdir(parents=True)
    shutil.copy(wheel, home / "dist")
    # Nothing of the checkout or of this test run leaks into the project.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV", "SHARDQ_PGDATA"}
        and not k.startswith(("PG", "SHARDQ_", "DJANGO_"))
    }
    env.update(
        PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
        VIRTUAL_ENV=str(venv),
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONUNBUFFERED="1",
        PGDATABASE=database["NAME"],
        **{
            k: str(v)
            for k, v in {
                "PGHOST": database["HOST"],
                "PGPORT": database["PORT"],
                "PGUSER": database["USER"],
                "PGPASSWORD": database["PASSWORD"],
            }.items()
            if v
        },
        **SUPERUSER,
    )
    user = Newcomer(home, env)
    user.blocks = blocks
    yield user
    user.stop_all()


def job_status(database: dict, job_id: str) -> tuple | None:
    with admin_connection(database, database["NAME"]) as conn:
        return conn.execute("SELECT status, return_value FROM shardq_job WHERE id = %s", [int(job_id)]).fetchone()


def test_the_readme_takes_a_newcomer_from_pip_install_to_a_job_run_and_the_admin(newcomer, database):
    blocks = newcomer.blocks
    began = time.monotonic()
    newcomer.shell(blocks["install"])
    newcomer.shell(blocks["project"])
    settings = newcomer.cwd / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + blocks["settings"])
    first_line, _ = blocks["tasks"].split("\n", 1)
    tasks_file = newcomer.cwd / first_line.removeprefix("# ").strip()
    tasks_file.write_text(blocks["tasks"])
    newcomer.shell(blocks["migrate"])

    (worker_line,) = command_lines(blocks["worker"])
    worker = newcomer.start(worker_line)
    printed = newcomer.python(blocks["enqueue"]).split()
    job_id, status = printed[-2], printed[-1]
    assert status == "READY", printed
    wait_until(
        lambda: job_status(database, job_id) and job_status(database, job_id)[0] == "SUCCESSFUL",
        timeout=120,
        interval=0.2,
        message=lambda: f"job {job_id} to succeed ({job_status(database, job_id)}):\n{worker.log_path.read_text()}",
    )
    assert job_status(database, job_id)[1] == "receipt of order 1 sent to customer 7"

    create_user, server_line = command_lines(blocks["admin"])
    newcomer.shell(create_user)
    port = free_port()
    server = newcomer.start(server_line, f"127.0.0.1:{port}")
    jobs_page = f"http://127.0.0.1:{port}/admin/shardq/job/"
    with requests.Session() as browser:
        login = f"http://127.0.0.1:{port}/admin/login/?next=/admin/shardq/job/"
        wait_until(
            lambda: _answers(browser, login, server),
            timeout=60,
            interval=0.2,
            message=lambda: f"runserver to answer:\n{server.log_path.read_text()}",
        )
        page = browser.post(
            login,
            data={
                "username": SUPERUSER["DJANGO_SUPERUSER_USERNAME"],
                "password": SUPERUSER["DJANGO_SUPERUSER_PASSWORD"],
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
                "next": "/admin/shardq/job/",
            },
            timeout=30,
        )
        assert page.status_code == 200 and page.url == jobs_page, (page.status_code, page.url)
        assert "shop.tasks.send_receipt" in page.text and "SUCCESSFUL" in page.text
        stylesheet = re.search(r'href="(/static/admin/css/base\.css)"', page.text)
        assert stylesheet and browser.get(f"http://127.0.0.1:{port}{stylesheet[1]}", timeout=30).status_code == 200

    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.log_path.read_text()
    log = worker.log_path.read_text()
    assert " started (pid " in log and " stopped: released 64 shards" in log, log

    # The README's test, run by Django's runner from the wheel alone (no pytest in this venv).
    first_line, _ = blocks["tests"].split("\n", 1)
    (newcomer.cwd / first_line.removeprefix("# ").strip()).write_text(blocks["tests"])
    newcomer.shell(blocks["test"])
    print(f"[readme] install to admin page in {time.monotonic() - began:.1f}s")


def _answers(browser: requests.Session, url: str, server: subprocess.Popen) -> bool:
    assert server.poll() is None, f"runserver exited {server.returncode}"
    try:
        return browser.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False
