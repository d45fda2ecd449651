"""An embedded PostgreSQL (the ``pgserver`` wheel) for machines without one.

Used only when ``DATABASE_URL`` is unset: the example project's settings then
start a server whose data lives in the project's git-ignored ``.pgdata``
folder. Child processes (gunicorn, workers, the tests' workers) join the
running server through the exported URL. ``start(stop_at_exit=True)`` stops
the server when the process that started it exits; a process that only
joined a running server never stops it. ``stop()`` ends it from anywhere
(``make clean`` calls it before deleting ``.pgdata``).

Where the data lives, first match wins:

1. the ``path`` argument of ``start()`` / ``stop()``;
2. the ``SHARDQ_PGDATA`` environment variable (the data folder itself);
3. ``base / ".pgdata"`` for ``data_dir(base)`` — the example settings pass
   their ``BASE_DIR``, since a settings module cannot read
   ``django.conf.settings`` while it is being imported;
4. ``settings.BASE_DIR / ".pgdata"`` when Django settings are configured;
5. otherwise ``data_dir()`` raises ``ImproperlyConfigured`` saying so —
   never a folder inside ``site-packages``. ``stop()`` alone falls back to
   ``.pgdata`` in the current directory (a checkout's CI calls it bare), where
   nothing to stop is no error.
"""

import hashlib
import os
import tempfile
import warnings
from pathlib import Path
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured

# A Unix socket path may hold at most 107 bytes; the socket lives in PGDATA.
_MAX_SOCKET_DIR = 90
ENV_VAR = "SHARDQ_PGDATA"


def data_dir(base: Path | str | None = None) -> Path:
    """The data folder (see the module docstring for the order), or a short
    folder in the temp dir when ``base / ".pgdata"`` is too long for the
    server's Unix socket."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit)
    if base is None:
        base = _settings_base_dir()
        if base is None:
            raise ImproperlyConfigured(
                "shardq.embedded does not know where to keep the embedded PostgreSQL's data: set "
                f"{ENV_VAR}=/path/to/pgdata, configure Django settings with a BASE_DIR, "
                "or pass the folder (embedded.start(embedded.data_dir(BASE_DIR)))."
            )
    base = Path(base)
    path = base / ".pgdata"
    if len(str(path)) > _MAX_SOCKET_DIR:
        digest = hashlib.sha1(str(base).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"shardq-pg-{digest}"
    return path


def _settings_base_dir() -> Path | None:
    from django.conf import settings

    if not settings.configured:
        return None
    base = getattr(settings, "BASE_DIR", None)
    return Path(base) if base else None


# The data folders this process started a server in (not the ones it joined).
_started: set[Path] = set()


def running(path: Path) -> bool:
    """Does a server run on ``path`` (its postmaster.pid names a live process)?"""
    try:
        pid = int((path / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def started_here(path: Path | None = None) -> bool:
    """Did this process start the server (on ``path``, or on any folder)?"""
    return (path in _started) if path is not None else bool(_started)


def start(path: Path | None = None, *, stop_at_exit: bool = False) -> str:
    """Start (or join) the embedded server and return its DATABASE_URL.

    With ``stop_at_exit`` a server this call started is stopped when this
    process exits (not its forked children, nor a server it joined)."""
    try:
        with warnings.catch_warnings():
            # pgserver asks platformdirs for a runtime directory at import;
            # without XDG_RUNTIME_DIR (a container, cron, CI) platformdirs
            # warns and falls back to /tmp, which is all pgserver needs.
            warnings.filterwarnings("ignore", message=r"XDG_RUNTIME_DIR is not set")
            import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImproperlyConfigured(
            "DATABASE_URL is unset and the embedded PostgreSQL is not installed: "
            "set DATABASE_URL=postgres://... or `pip install 'shardq[embedded]'`."
        ) from exc
    path = path or data_dir()
    path.mkdir(parents=True, exist_ok=True)
    joined = running(path)
    server = pgserver.get_server(str(path), cleanup_mode=None)
    server.psql("SELECT 1;")  # wait until it accepts connections
    if not joined:
        _started.add(path)
        if stop_at_exit:
            import atexit

            atexit.register(_stop_if_owner, path, os.getpid())
    return f"postgres://postgres@/postgres?host={quote(str(path))}"


def _stop_if_owner(path: Path, owner: int) -> None:
    # A forked child runs atexit handlers too when it exits normally: only
    # the process that started the server stops it.
    if os.getpid() == owner:
        stop(path)


def stop(path: Path | None = None) -> None:
    """Stop the embedded server if it runs (``pg_ctl stop -m fast``)."""
    import subprocess

    if path is None:
        try:
            path = data_dir()
        except ImproperlyConfigured:
            # Nothing configured (a bare ``python -c 'embedded.stop()'`` in a
            # checkout): the current directory's server, if one runs there.
            path = data_dir(Path.cwd())
    if not (path / "postmaster.pid").exists():
        return
    with warnings.catch_warnings():
        # As in start(): platformdirs' XDG_RUNTIME_DIR warning at pgserver's import.
        warnings.filterwarnings("ignore", message=r"XDG_RUNTIME_DIR is not set")
        from pgserver._commands import POSTGRES_BIN_PATH

    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(path), "-m", "fast", "-w", "stop"]
    if os.geteuid() == 0:
        cmd = ["su", "pgserver", "-s", "/bin/sh", "-c", " ".join(map(quote_shell, cmd))]
    subprocess.run(cmd, check=False, capture_output=True)


def quote_shell(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
