"""Debian's PgBouncer (``make test`` installs it) in transaction pooling
mode, started by a test on a free port of 127.0.0.1 in front of the shared
PostgreSQL server: for what must work through a transaction pool
(docs/scaling.md, "PgBouncer").

Few server connections (``default_pool_size``) for many clients, so
consecutive transactions of one client land on different server sessions,
as they do in production: whatever relies on session state breaks here.
PgBouncer refuses to run as root; under root it switches to the
``postgres`` (else ``nobody``) user, reading its files from a fresh
world-readable directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """``PgBouncer(host, port)``: ``start()``, then ``port``; ``stop()``."""

    def __init__(self, server_host: str, server_port: int, *, pool_size: int = 2, user: str = "root") -> None:
        if not os.path.exists(PGBOUNCER):
            raise RuntimeError(f"{PGBOUNCER} is missing: run `make test` (it installs Debian's pgbouncer)")
        self.user = user
        self.base = Path(tempfile.mkdtemp(prefix="shardq-pgbouncer-"))
        self.base.chmod(0o755)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        (self.base / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.base / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server_host} port={server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.base / 'userlist.txt'}\n"
            f"admin_users = {user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            # psycopg and Django send these at connect; PgBouncer passes only what it knows.
            "ignore_startup_parameters = extra_float_digits,options\n"
            # Idle server connections go soon: the test database can be dropped after.
            "server_idle_timeout = 5\n"
        )
        for name in ("userlist.txt", "pgbouncer.ini"):
            (self.base / name).chmod(0o644)
        self.proc: subprocess.Popen | None = None
        self.log = self.base / "pgbouncer.log"

    def start(self, timeout: float = 30.0) -> PgBouncer:
        command = [PGBOUNCER]
        if os.geteuid() == 0:
            command += ["-u", _unprivileged_user()]
        command.append(str(self.base / "pgbouncer.ini"))
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)  # a poll of the listening socket, not a wait for an event
        raise RuntimeError(f"pgbouncer did not listen on {self.port} within {timeout} s:\n{self.log.read_text()}")

    def client_applications(self) -> list[str]:
        """The application_name of every client PgBouncer serves now (SHOW
        CLIENTS on its admin console; the console's own connection included)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user=self.user, autocommit=True
        ) as conn:
            cursor = conn.execute("SHOW CLIENTS")
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True))["application_name"] for row in cursor.fetchall()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: immediate shutdown, server connections closed
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("pgbouncer refuses root and neither a postgres nor a nobody user exists")
