"""A throwaway PostgreSQL cluster of a test's or a benchmark's own, never the
shared server on 5432: for what stops, crashes, replicates or needs settings
of its own (pg_stat_statements, autovacuum at its defaults).

It runs as the ``postgres`` system user (initdb refuses root) under a fresh
temporary directory, on a free port of 127.0.0.1 (or ``host``), with trust
authentication; ``destroy()`` stops it and removes everything.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def postgres_bindir() -> Path:
    """The newest installed server's bin directory (Debian's layout), or pg_config's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    try:
        out = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found: install postgresql") from exc
    return Path(out.strip())


BINDIR = postgres_bindir()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """``PrivatePostgres("faults", "shardq_private", settings={"fsync": "off"})``;
    ``init()``, ``start()``, then ``url``; ``crash()`` (immediate stop),
    ``stop()``, ``destroy()``."""

    def __init__(
        self,
        prefix: str,
        database: str,
        *,
        settings: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.user = pwd.getpwnam("postgres")
        self.base = Path(tempfile.mkdtemp(prefix=f"shardq-{prefix}-pg-"))
        os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        self.data = self.base / "data"
        self.host = host
        self.port = port or free_port(host)
        self.database = database
        self.settings = {"fsync": "off", "max_connections": "100", **(settings or {})}
        self.url = f"postgres://postgres@{host}:{self.port}/{database}"

    def as_postgres(self, *cmd: str, timeout: float = 120) -> str:
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd],
            check=True,
            cwd=self.base,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        return done.stdout

    def init(self) -> None:
        self.as_postgres(
            str(BINDIR / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses={self.host} -c unix_socket_directories={self.base} " + " ".join(
            f"-c {name}={value}" for name, value in self.settings.items()
        )
        self.as_postgres(
            str(BINDIR / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.base / "server.log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def createdb(self, name: str | None = None) -> None:
        self.as_postgres(str(BINDIR / "createdb"), "-h", self.host, "-p", str(self.port), name or self.database)

    def crash(self) -> None:
        """Stop at once (``-m immediate``): what a server crash leaves, WAL replayed at the next start."""
        self.as_postgres(str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self.as_postgres(str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        try:
            self.as_postgres(str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.base, ignore_errors=True)

    def log(self) -> str:
        path = self.base / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""
