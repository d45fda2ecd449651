"""The embedded PostgreSQL (``shardq.embedded``) is stopped by whoever
started it: a ``manage.py`` command of the example project that started it
stops it when it exits; one that joined a running server leaves it running."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shardq import embedded
from tests.workers import ROOT

pytestmark = [pytest.mark.timeout(300), pytest.mark.process]


@pytest.fixture
def pgdata():
    # Short: the server's Unix socket lives in its data folder.
    path = Path(tempfile.mkdtemp(prefix="sq-emb-"))
    yield path
    embedded.stop(path)
    shutil.rmtree(path, ignore_errors=True)


def manage_check(pgdata: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SHARDQ_EMBEDDED_STARTED_BY"}}
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings", SHARDQ_PGDATA=str(pgdata))
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


def test_a_command_that_started_the_embedded_server_stops_it_when_it_exits(pgdata):
    done = manage_check(pgdata)

    assert done.returncode == 0, done.stderr
    assert (pgdata / "PG_VERSION").exists(), "the command did not use the embedded server"
    assert not embedded.running(pgdata)


def test_a_command_that_joined_a_running_server_leaves_it_running(pgdata):
    embedded.start(pgdata)
    assert embedded.running(pgdata)

    done = manage_check(pgdata)

    assert done.returncode == 0, done.stderr
    assert embedded.running(pgdata)
    embedded.stop(pgdata)
    assert not embedded.running(pgdata)
