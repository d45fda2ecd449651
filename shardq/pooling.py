"""Connection poolers (docs/scaling.md, "PgBouncer"): what shardq can tell
of a database alias that goes through a transaction pool, and the alias
``shardq_worker`` connects through.

The web side (enqueue, ``get_result``, cancel, the admin) runs one
statement or one transaction at a time on Django's connection, which a
transaction pool serves: it holds no session state between transactions,
except the enqueue's server-side prepared statement, which the backend
leaves off for an alias that Django is told is pooled
(``DISABLE_SERVER_SIDE_CURSORS``, what Django's own docs ask of a
transaction pool). A worker needs a session: it LISTENs, holds a session
advisory lock (the cluster gauges, a reshard), and keeps its connection's
settings. So it connects through ``SHARDQ["WORKER_DATABASE"]`` when set:
an alias in DATABASES that reaches PostgreSQL directly or through a
session pool.
"""

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections

#: PgBouncer's default port: an alias on it is taken to go through PgBouncer.
PGBOUNCER_PORT = 6432


def worker_database(backend_database: str = DEFAULT_DB_ALIAS) -> str:
    """The alias a worker connects through: ``SHARDQ["WORKER_DATABASE"]``,
    else the backend's own (``TASKS[...]["OPTIONS"]["DATABASE"]``)."""
    alias = (getattr(settings, "SHARDQ", {}) or {}).get("WORKER_DATABASE")
    return backend_database if alias is None else alias


def transaction_pooled(alias: str) -> str | None:
    """Why ``alias`` looks like a transaction pool (None: nothing says so):
    Django's ``DISABLE_SERVER_SIDE_CURSORS`` (set for transaction pooling),
    or PgBouncer's port."""
    config = connections.settings.get(alias) or {}
    if config.get("DISABLE_SERVER_SIDE_CURSORS"):
        return f"DATABASES[{alias!r}] sets DISABLE_SERVER_SIDE_CURSORS, as Django asks of a transaction pool"
    port = config.get("PORT")
    if str(port).strip() == str(PGBOUNCER_PORT):
        return f"DATABASES[{alias!r}] connects to port {PGBOUNCER_PORT}, PgBouncer's"
    return None


def pooling_checks(backend) -> list[checks.CheckMessage]:
    """shardq.E020 (WORKER_DATABASE names no alias) and shardq.W020 (the
    worker would LISTEN through what looks like a transaction pool)."""
    configured = (getattr(settings, "SHARDQ", {}) or {}).get("WORKER_DATABASE")
    if configured is not None and configured not in connections.settings:
        return [
            checks.Error(
                f"SHARDQ['WORKER_DATABASE'] = {configured!r} is not in DATABASES.",
                hint="Name the DATABASES alias shardq_worker connects through (a direct or session-pooled "
                "connection), or leave it unset to use the backend's.",
                id="shardq.E020",
            )
        ]
    alias = worker_database(backend.database_alias)
    reason = transaction_pooled(alias)
    if reason is None:
        return []
    where = "SHARDQ['WORKER_DATABASE']" if configured is not None else f"TASKS[{backend.alias!r}]'s database"
    return [
        checks.Warning(
            f"shardq_worker connects through {alias!r} ({where}), and {reason}: a worker LISTENs and holds "
            "session advisory locks, which a transaction pool breaks (wake-ups lost, locks on the wrong "
            "session).",
            hint="Add a DATABASES alias that reaches PostgreSQL directly or through a session pool and name "
            "it in SHARDQ['WORKER_DATABASE'] (docs/scaling.md, \"PgBouncer\").",
            id="shardq.W020",
        )
    ]
