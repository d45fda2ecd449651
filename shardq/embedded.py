"""An embedded PostgreSQL (the ``pgserver`` wheel) for machines without one.

Used only when ``DATABASE_URL`` is unset: ``make demo`` and ``make test`` then
run against a server whose data lives in the git-ignored ``.pgdata`` folder of
the checkout. The server keeps running after the process that started it
exits, so gunicorn, workers and tests share it; ``stop()`` ends it.
"""

import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

# A Unix socket path may hold at most 107 bytes; the socket lives in PGDATA.
_MAX_SOCKET_DIR = 90


def data_dir(base: Path | None = None) -> Path:
    base = base or Path(__file__).resolve().parent.parent
    path = base / ".pgdata"
    if len(str(path)) > _MAX_SOCKET_DIR:
        digest = hashlib.sha1(str(base).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"shardq-pg-{digest}"
    return path


def start(path: Path | None = None) -> str:
    """Start (or join) the embedded server and return its DATABASE_URL."""
    try:
        import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "DATABASE_URL is unset and the embedded PostgreSQL is not installed: "
            "set DATABASE_URL=postgres://... or `pip install 'shardq[embedded]'`."
        ) from exc
    path = path or data_dir()
    path.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(path), cleanup_mode=None)
    server.psql("SELECT 1;")  # wait until it accepts connections
    return f"postgres://postgres@/postgres?host={quote(str(path))}"


def stop(path: Path | None = None) -> None:
    """Stop the embedded server if it runs (``pg_ctl stop -m fast``)."""
    import subprocess

    path = path or data_dir()
    if not (path / "postmaster.pid").exists():
        return
    from pgserver._commands import POSTGRES_BIN_PATH

    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(path), "-m", "fast", "-w", "stop"]
    if os.geteuid() == 0:
        cmd = ["su", "pgserver", "-s", "/bin/sh", "-c", " ".join(map(quote_shell, cmd))]
    subprocess.run(cmd, check=False, capture_output=True)


def quote_shell(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
