"""Fault 4: PostgreSQL itself stops (``pg_ctl -m immediate``: a crash) and
comes back, three times during a run. The workers report "database
unavailable", resume within 30 s of the server coming back, the lease rows
are intact and the guarantees (a)–(e) hold.

The test runs its own PostgreSQL (initdb/pg_ctl as the ``postgres`` user, a
temporary directory, a free port): the shared server is never touched.
"""

import os
import subprocess
import sys
import time

import psycopg
import pytest

from tests.faults.harness import LEDGER_TASK, check_invariants, figures, insert_jobs, size, wait_all_finished
from tests.helpers import wait_until
from tests.pgserver import PrivatePostgres
from tests.workers import ROOT, WorkerPool

RESTARTS = 3
JOBS = size(1500, 10000)
JOB_SECONDS = 0.05
DOWN_SECONDS = 2.0
RESUME_BOUND = 30.0


class Reconnecting:
    """``query(sql, params)`` over an autocommit connection that comes back
    after the server does."""

    def __init__(self, url: str):
        self.url = url
        self.conn = None

    def __call__(self, sql, params=None):
        for attempt in (1, 2):
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.url, autocommit=True, application_name="faults-observer")
                cursor = self.conn.execute(sql, params)
                return cursor.fetchall() if cursor.description else []
            except psycopg.OperationalError:
                self.conn = None
                if attempt == 2:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()


@pytest.fixture
def private_postgres():
    # fsync off: an immediate stop kills the server processes, not the OS,
    # so committed data stays in the page cache and recovery replays WAL.
    server = PrivatePostgres("faults", "shardq_private")
    try:
        server.init()
        server.start()
        server.createdb()
        env = dict(os.environ, DATABASE_URL=server.url, DJANGO_SETTINGS_MODULE="tests.settings")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300
        )
        yield server
    finally:
        server.destroy()


def test_workers_survive_three_database_crashes_and_resume_within_30s(private_postgres, tmp_path):
    server = private_postgres
    query = Reconnecting(server.url)
    pool = WorkerPool(tmp_path)
    try:
        procs = [pool.start("--concurrency", "4", env={"DATABASE_URL": server.url}) for _ in range(2)]
        wait_until(
            lambda: query("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL")[0][0] == 64,
            timeout=90,
            message="the workers to own every shard",
        )
        insert_jobs(query, LEDGER_TASK, JOBS, kwargs_sql=f"jsonb_build_object('n', g, 'sleep', {JOB_SECONDS})")

        resumes: list[float] = []
        for _ in range(RESTARTS):
            done_before = query("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0]
            wait_until(
                lambda: query("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] >= done_before + 50,
                timeout=60,
                message="progress before the crash",
            )
            versions = dict(query("SELECT shard, claim_version FROM shardq_shard"))
            server.crash()
            time.sleep(DOWN_SECONDS)  # pacing: the server stays down this long
            server.start()
            back = time.monotonic()
            rows = query("SELECT shard, claim_version FROM shardq_shard")
            assert len(rows) == 64 and all(v >= versions[s] for s, v in rows), "lease rows lost in the crash"
            started = query("SELECT pg_postmaster_start_time()")[0][0]
            wait_until(
                lambda: (
                    query(
                        "SELECT count(*) FROM shardq_worker WHERE state = 'RUNNING' AND heartbeat_at > %s", [started]
                    )[0][0]
                    == 2
                    and (
                        query("SELECT count(*) FROM shardq_job WHERE finished_at > %s", [started])[0][0] > 0
                        or not query("SELECT 1 FROM shardq_job WHERE status <> 'SUCCESSFUL' LIMIT 1")
                    )
                ),
                timeout=RESUME_BOUND + 30,
                interval=0.1,
                message="both workers to resume",
            )
            resumes.append(time.monotonic() - back)

        wait_all_finished(query, JOBS, timeout=size(180, 900))
        assert all(p.poll() is None for p in procs), "a worker died with the database"
        logs = [pool.log(p) for p in procs]
        assert all("database unavailable" in log for log in logs), "each worker reports the outage"
        report = check_invariants(query, expected_jobs=JOBS)
        assert report["statuses"] == {"SUCCESSFUL": JOBS}, report
        figures(
            "database_restart",
            restarts=RESTARTS,
            jobs=JOBS,
            resume_max=max(resumes),
            resume_all=[round(r, 2) for r in resumes],
            **{
                k: report[k]
                for k in (
                    "extra_executions",
                    "rescued",
                    "retries",
                    "fence_rejections",
                    "self_fences",
                    "double_commits",
                    "lost",
                )
            },
        )
        assert max(resumes) <= RESUME_BOUND, resumes
    finally:
        pool.stop_all()
        query.close()
