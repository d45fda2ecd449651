"""An embedded PostgreSQL (the ``pgserver`` wheel) for machines without one.

Used only when ``DATABASE_URL`` is unset: the example project's settings then
start a server whose data lives in the project's git-ignored ``.pgdata``
folder. The server keeps running after the process that started it exits, so
gunicorn, workers and tests share it; ``stop()`` ends it.

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


def start(path: Path | None = None) -> str:
    """Start (or join) the embedded server and return its DATABASE_URL."""
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
    server = pgserver.get_server(str(path), cleanup_mode=None)
    server.psql("SELECT 1;")  # wait until it accepts connections
    return f"postgres://postgres@/postgres?host={quote(str(path))}"


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
    from pgserver._commands import POSTGRES_BIN_PATH

    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(path), "-m", "fast", "-w", "stop"]
    if os.geteuid() == 0:
        cmd = ["su", "pgserver", "-s", "/bin/sh", "-c", " ".join(map(quote_shell, cmd))]
    subprocess.run(cmd, check=False, capture_output=True)


def quote_shell(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
