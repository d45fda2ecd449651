"""PgBouncer in transaction pooling mode (issue 28 §3, docs/scaling.md
"PgBouncer"): the web side (enqueue from 8 threads, some in the caller's
transaction, get_result, cancel, the admin's pages) runs on Django's
default connection through Debian's pgbouncer, started here on a port of
its own with 2 server connections for the 8 clients; a real
``shardq_worker`` connects directly through SHARDQ["WORKER_DATABASE"] and
drains every job: none lost, none twice."""

import json
import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from django.db import connection

from tests.helpers import sql, wait_until
from tests.pgbouncer import PgBouncer
from tests.workers import ROOT, database_url

pytestmark = pytest.mark.timeout(300)

THREADS, PER_THREAD = 8, 125


@pytest.fixture
def pgbouncer():
    s = connection.settings_dict
    bouncer = PgBouncer(s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432), user=s["USER"]).start()
    yield bouncer
    bouncer.stop()


def pooled_url(port: int) -> str:
    s = connection.settings_dict
    return f"postgres://{quote(s['USER'], safe='')}@127.0.0.1:{port}/{quote(s['NAME'], safe='')}"


def test_the_web_side_works_through_pgbouncer_and_a_worker_on_the_direct_alias_drains_every_job(workers, pgbouncer):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": pooled_url(pgbouncer.port),
        "SHARDQ_TEST_DIRECT_DATABASE_URL": database_url(),
    }
    web = subprocess.run(
        [sys.executable, "-m", "tests.pgbouncer_web", str(THREADS), str(PER_THREAD)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert web.returncode == 0, web.stderr
    out = json.loads(web.stdout.splitlines()[-1])
    assert out["errors"] == []
    assert out["prepared_statements"] is False  # DISABLE_SERVER_SIDE_CURSORS: nothing prepared per session
    ids = sorted(map(int, out["ids"]))
    assert len(ids) == len(set(ids)) == THREADS * PER_THREAD
    assert set(out["statuses"].values()) <= {"READY", "RUNNING", "SUCCESSFUL"}
    assert len(out["cancelled"]) == 3 and out["cancelled_status"] == ["FAILED"] * 3
    assert out["admin"] and set(out["admin"].values()) == {200}, out["admin"]

    worker = workers.start(
        "--concurrency",
        "4",
        env={"DATABASE_URL": pooled_url(pgbouncer.port), "SHARDQ_TEST_DIRECT_DATABASE_URL": database_url()},
    )
    wait_until(
        lambda: (
            sql("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [ids])[0][0] == len(ids)
        ),
        timeout=180,
        message=lambda: (sql("SELECT status, count(*) FROM shardq_job GROUP BY 1"), workers.log(worker)),
    )
    # Each ran once, by the worker, and nothing else happened to it.
    assert sql("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND attempts = 1", [ids])[0][0] == len(ids)
    # The worker's connections (lease, claims, LISTEN) are direct, not through PgBouncer.
    assert "shardq.W020" not in workers.log(worker)
    # The LISTEN session records itself on the worker's row once its LISTENs
    # are in (dead-owner detection), and only where the server's pid is the
    # one the client was told: a direct connection.
    listeners = sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'shardq-listener' "
        "AND pid IN (SELECT listener_pid FROM shardq_worker WHERE listener_pid IS NOT NULL)"
    )[0][0]
    assert listeners == 1
    assert pgbouncer.client_applications() and not [
        name for name in pgbouncer.client_applications() if name.startswith("shardq-")
    ]  # PgBouncer's own list of clients: the web's, not the worker's
    assert worker.poll() is None, workers.log(worker)
