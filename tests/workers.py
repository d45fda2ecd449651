"""Real worker processes for acceptance and fault tests.

``WorkerPool`` starts ``manage.py shardq_worker`` processes against the test
database (short lease settings so takeovers happen in seconds) and kills
whatever is left at teardown. ``db`` helpers read the tables over a separate
autocommit connection, as an operator would.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent

FAST_LEASES = {
    "SHARDQ_LEASE_TTL": "2",
    "SHARDQ_HEARTBEAT": "0.4",
    "SHARDQ_POLL_INTERVAL": "0.2",
}


def database_url() -> str:
    """DATABASE_URL of the test database the current test runs against."""
    s = connection.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or s.get("OPTIONS", {}).get("host", "")
    name = quote(s["NAME"], safe="")
    if host.startswith("/"):
        return f"postgres://{user}{password}@/{name}?host={quote(host)}"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{user}{password}@{host}{port}/{name}"


class WorkerPool:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.seen_children: set[int] = set()  # pids of our workers' children, recorded while seen

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(FAST_LEASES)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DATABASE_URL=database_url(),
            SHARDQ_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "w")  # noqa: SIM115 (closed by stop_all)
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "shardq_worker", *args],
            cwd=ROOT,
            env=self.env(**(env or {})),
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session and process group, as under a terminal or
            # systemd: os.killpg(proc.pid, ...) signals it as they would.
            # (--processes children run in process groups of their own;
            # stop_all kills those too.)
            start_new_session=True,
        )
        proc.log_path = log.name
        proc.log_file = log  # closed by stop_all (the child holds its own copy)
        self.procs.append(proc)
        # Returned once it handles SIGTERM (its stop rule is installed), as a
        # service manager would see it started: a test that signals it at
        # once then tests the rule, not Python's default action (exit -15).
        wait_until(
            lambda: proc.poll() is not None or handles(proc.pid, signal.SIGTERM),
            timeout=60,
            interval=0.02,
            message=f"worker pid {proc.pid} to install its signal handlers",
        )
        return proc

    def stop_all(self) -> None:
        """SIGKILL every worker, its process group and its children's groups:
        no orphan survives a test (a supervisor's children each lead a
        process group of their own)."""
        for proc in self.procs:
            self.children(proc)
            kill_tree(proc.pid)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            proc.log_file.close()
        for pid in self.orphans():
            kill_tree(pid)

    def orphans(self) -> list[int]:
        """Children of our workers still alive (after their parent ended they
        are re-parented: known by the pids recorded while it lived)."""
        return sorted(pid for pid in self.seen_children if alive(pid))

    def children(self, proc) -> list[int]:
        """The pids of ``proc``'s child processes (a supervisor's workers), recorded."""
        pids = children_of(proc.pid)
        self.seen_children.update(pids)
        return pids

    def log(self, proc) -> str:
        return Path(proc.log_path).read_text()


def children_of(pid: int) -> list[int]:
    """Child pids of ``pid`` (Linux /proc)."""
    found = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            found = [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def handles(pid: int, signum: int) -> bool:
    """Has ``pid`` a handler for ``signum`` (Linux /proc: SigCgt)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_tree(pid: int) -> None:
    """SIGCONT then SIGKILL ``pid``'s process group and, first, the process
    groups of its children (each child of a supervisor leads its own)."""
    pids = children_of(pid)
    for child in pids:
        pids.extend(children_of(child))
    for target in [pid, *pids]:
        for send in (os.killpg, os.kill):
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    send(target, signum)
                except (ProcessLookupError, PermissionError):
                    pass


def query(sql: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def scalar(sql: str, params=None):
    rows = query(sql, params)
    return rows[0][0] if rows else None


def worker_id_of(pid: int, timeout: float = 30.0) -> str:
    """The incarnation id a worker process registered with."""
    return str(
        wait_until(
            lambda: scalar("SELECT id FROM shardq_worker WHERE pid = %s ORDER BY started_at DESC LIMIT 1", [pid]),
            timeout=timeout,
            message=f"worker pid {pid} to register",
        )
    )


def worker_stats(worker_id: str) -> dict:
    value = scalar("SELECT stats FROM shardq_worker WHERE id = %s", [worker_id])
    return json.loads(value) if isinstance(value, str) else (value or {})


def shards_by_owner() -> dict[str, int]:
    rows = query(
        "SELECT owner::text, count(*) FROM shardq_shard WHERE owner IS NOT NULL AND lease_expires > clock_timestamp() GROUP BY 1"
    )
    return {owner: n for owner, n in rows}


def status_counts() -> dict[str, int]:
    return dict(query("SELECT status, count(*) FROM shardq_job GROUP BY 1"))


def wait_drained(total: int, timeout: float = 120.0) -> None:
    wait_until(
        lambda: status_counts().get("SUCCESSFUL", 0) + status_counts().get("FAILED", 0) >= total,
        timeout=timeout,
        interval=0.2,
        message=f"{total} jobs to finish (now {status_counts()})",
    )


def monotonic() -> float:
    return time.monotonic()
