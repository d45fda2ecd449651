"""A throwaway PostgreSQL server for the scale tests (initdb/pg_ctl as the
``postgres`` system user, a temporary directory, a free port): the shared
server is never touched, and a test may preload pg_stat_statements or listen
on an address of its own (a veth end) without reconfiguring anybody's server.
"""

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from tests.workers import ROOT

BINDIR = Path("/usr/lib/postgresql/15/bin")
DATABASE = "shardq_scale"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """``start()`` → a migrated database ``shardq_scale``; ``destroy()`` stops and deletes it."""

    def __init__(
        self, listen: str = "127.0.0.1", settings: dict[str, str] | None = None, trust_networks: tuple[str, ...] = ()
    ):
        self.user = pwd.getpwnam("postgres")
        self.base = Path(tempfile.mkdtemp(prefix="shardq-scale-pg-"))
        os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        self.data = self.base / "data"
        self.listen = listen
        self.port = free_port()
        self.trust_networks = trust_networks  # pg_hba lines: these networks log in without a password
        self.settings = {"fsync": "off", "max_connections": "300", **(settings or {})}

    def url(self, host: str = "127.0.0.1", user: str = "postgres", database: str = DATABASE) -> str:
        return f"postgres://{user}@{host}:{self.port}/{database}"

    def _as_postgres(self, *cmd: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd],
            check=True,
            cwd=self.base,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
        )

    def start(self) -> None:
        self._as_postgres(
            str(BINDIR / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        if self.trust_networks:
            with open(self.data / "pg_hba.conf", "a") as hba:
                for network in self.trust_networks:
                    hba.write(f"host all all {network} trust\n")
        options = " ".join(
            [f"-p {self.port}", f"-c listen_addresses={self.listen}", f"-c unix_socket_directories={self.base}"]
            + [f"-c {k}={v}" for k, v in self.settings.items()]
        )
        self._as_postgres(
            str(BINDIR / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.base / "server.log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip
        with psycopg.connect(self.url(database="postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
            # The test's own observer: its statements are told apart from
            # the workers' in pg_stat_statements by role.
            conn.execute("CREATE ROLE observer LOGIN SUPERUSER")
        env = dict(os.environ, DATABASE_URL=self.url(), DJANGO_SETTINGS_MODULE="tests.settings")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300
        )

    def destroy(self) -> None:
        try:
            self._as_postgres(str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.base, ignore_errors=True)
