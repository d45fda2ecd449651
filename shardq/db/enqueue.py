"""The enqueue statements, run on the caller's Django connection (so inside
``transaction.atomic()`` a job exists exactly when the caller commits).

Two hot paths bypass parts of Django's cursor machinery, on the same
connection and so in the same transaction (``shardq/backend.py`` says why):

* ``fetch_one`` runs one statement (``insert_job``, ``insert_unique_job``)
  as a server-side prepared statement: psycopg ``prepare=True`` on a
  server-binding cursor kept per raw connection. Errors still go through
  ``connection.wrap_database_errors``, a broken ``atomic()`` block is still
  refused, and when Django logs queries (``DEBUG``,
  ``CaptureQueriesContext``) or the connection has ``execute_wrapper()``s a
  Django cursor runs it instead, so they see the statement.
* ``copy_jobs`` reserves ids from the sequence, COPYs the rows and NOTIFYs
  each distinct shard once, inside one ``atomic()`` block (a savepoint
  within the caller's transaction): a failure stores nothing.

Every job INSERT and the COPY name the columns of ``job_columns`` in
shardq/db/sql/job.sql; the COPY rows below are written in that order, checked at import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, tzinfo
from typing import Any

import psycopg
from django.db import connections, transaction

from .errors import missing_tables_named
from .queries import QUERIES

# Rows per write during a bulk COPY: the server parses one chunk while the
# next is formatted.
COPY_CHUNK = 1000
_COPY_NULL = "\\N"
# The order copy_jobs writes a row's fields in: job_columns' order.
_COPY_ORDER = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "run_after",
    "shard",
    "key_hash",
    "shard_key",
    "ordered",
    "status",
    "status_rank",
    "fence",
    "attempts",
    "max_attempts",
    "args",
    "kwargs",
    "errors",
    "worker_ids",
    "enqueued_at",
    "limit_keys",
    "key_limited",
    "traceparent",
    "fair_key",
    "fair_weight",
    "tags",
)
JOB_COLUMNS = tuple(name.strip() for name in QUERIES["job_columns"].split(","))
if JOB_COLUMNS != _COPY_ORDER:
    raise ImportError(
        f"shardq/db/sql/job.sql's job_columns {JOB_COLUMNS} and the COPY row order in shardq/db/enqueue.py "
        f"{_COPY_ORDER} differ: change both together."
    )

# Django turns psycopg's automatic preparing off (prepare_threshold=None);
# a threshold never reached by count keeps it off for every other statement.
_NEVER_BY_COUNT = 2**31
_TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid
# The cursor enqueue runs its statement on, kept on the raw connection itself
# with the time zone its timestamps are loaded in: it lives and dies with the
# connection (a mapping keyed by the connection would keep it alive, the
# cursor referring to it), and a Django connection, so its cursor, belongs to
# one thread. A new cursor per statement costs more than the rest of the
# statement's client-side work: an adapters map, a transformer and a lookup
# of every result column's loader.
_CURSOR_ATTRIBUTE = "_shardq_statement_cursor"


def fetch_one(alias: str, query_name: str, params: dict[str, Any], *, prepared: bool = True) -> tuple[Any, ...]:
    """Run block ``query_name`` on connection ``alias`` (prepared when it can
    be) and return its one row (``TablesMissing`` before migrate)."""
    with missing_tables_named():
        return _fetch_one(alias, query_name, params, prepared)


def _fetch_one(alias: str, query_name: str, params: dict[str, Any], prepared: bool) -> tuple[Any, ...]:
    query = QUERIES[query_name]
    conn = connections[alias]
    if not prepared or conn.queries_logged or conn.execute_wrappers:
        return _fetch_one_django(conn, query, params)
    # What Django's cursor() and CursorWrapper.execute() check first.
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    raw = conn.connection
    if not isinstance(raw, psycopg.Connection):  # psycopg2, or not PostgreSQL at all
        return _fetch_one_django(conn, query, params)
    conn.validate_thread_sharing()
    conn.validate_no_broken_transaction()
    with conn.wrap_database_errors:
        cursor = _statement_cursor(raw, conn.timezone)
        # Django turns psycopg's statement preparing off on its connections
        # (prepare_threshold=None); turn it on for this one statement only.
        threshold = raw.prepare_threshold
        try:
            if threshold is None:
                raw.prepare_threshold = _NEVER_BY_COUNT
            cursor.execute(query, params, prepare=True)
            row: tuple[Any, ...] | None = cursor.fetchone()
            assert row is not None, f"{query_name} returns one row"
            return row
        finally:
            if threshold is None:
                raw.prepare_threshold = None


def _fetch_one_django(conn: Any, query: str, params: dict[str, Any]) -> tuple[Any, ...]:
    with conn.cursor() as cursor:
        cursor.execute(query, params)
        row: tuple[Any, ...] = cursor.fetchone()
        return row


def _statement_cursor(raw: psycopg.Connection[Any], timezone: tzinfo) -> psycopg.Cursor[Any]:
    """The cursor of ``raw`` for enqueue's statement, loading timestamps in
    ``timezone`` as Django's create_cursor() does."""
    kept = getattr(raw, _CURSOR_ATTRIBUTE, None)
    if kept is not None and kept[1] is timezone and not kept[0].closed:
        reused: psycopg.Cursor[Any] = kept[0]
        return reused
    cursor = psycopg.Cursor(raw)
    tz_loader = raw.adapters.get_loader(_TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)
    if timezone != tz_loader.timezone:  # type: ignore[union-attr]  # psycopg: type[Loader] | None
        from django.db.backends.postgresql.psycopg_any import register_tzloader

        register_tzloader(timezone, cursor)
    setattr(raw, _CURSOR_ATTRIBUTE, (cursor, timezone))
    return cursor


def copy_jobs(
    alias: str,
    params: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    *,
    notify: bool,
    channel: str,
    on_job: Callable[[int, int, datetime], None],
) -> None:
    """Insert one READY job per row (``key_hash``, ``shard_key``, ``args``,
    ``kwargs``; its ``shard`` is set here from the cluster's shard count; the
    rest from ``params``, shared) with one COPY, and
    NOTIFY each distinct shard once, in one atomic block. ``on_job(index,
    job id, enqueued_at)`` is called for each row while the server takes the
    rows in; an exception from it rolls everything back."""
    conn = connections[alias]
    with missing_tables_named(), transaction.atomic(using=alias), conn.cursor() as cursor:
        cursor.execute(QUERIES["reserve_job_ids"], {"n": len(rows), "shard_count": params["shard_count"]})
        ids, enqueued_at, shard_count = cursor.fetchone()
        # The cluster's count now (a reshard may have raised it): each row's shard.
        mask = shard_count - 1
        for row in rows:
            row["shard"] = row["key_hash"] & mask
        ids.sort()
        run_after = params["run_after"]
        # COPY text: the columns every row shares, escaped and formatted once.
        head = "\t".join(
            (
                copy_text(params["task_path"]),
                copy_text(params["backend"]),
                copy_text(params["queue_name"]),
                str(params["priority"]),
                (enqueued_at if run_after is None else run_after).isoformat(),
            )
        )
        middle = f"{'t' if params['ordered'] else 'f'}\tREADY\t0\t0\t0\t{params['max_attempts']}"
        tail = f"[]\t[]\t{enqueued_at.isoformat()}\t"
        # The limits every job of the task counts against (a JSON array, or
        # NULL); a row of a task limited per value has its own.
        static_limits = _COPY_NULL if params["limit_keys"] is None else copy_json(params["limit_keys"])
        # One enqueue span for the whole call (shardq/tracing.py): its context, or NULL.
        traceparent = _COPY_NULL if params.get("traceparent") is None else copy_text(params["traceparent"])
        tags = tags_field(params)
        lines: list[str] = []
        with conn.wrap_database_errors, cursor.copy(QUERIES["copy_jobs"]) as copy:
            for index, (job_id, row) in enumerate(zip(ids, rows, strict=True)):
                key = row["shard_key"]
                lines.append(
                    f"{job_id}\t{head}\t{row['shard']}\t{row['key_hash']}\t"
                    f"{_COPY_NULL if key is None else copy_text(key)}\t{middle}\t"
                    f"{copy_json(row['args'])}\t{copy_json(row['kwargs'])}\t{tail}"
                    f"{static_limits if 'limit_keys' not in row else limits_field(row)}\t"
                    f"{'t' if row.get('key_limited') else 'f'}\t{traceparent}\t{fair_fields(row, params)}\t{tags}\n"
                )
                on_job(index, job_id, enqueued_at)
                flush_chunk(copy, lines)
            flush_chunk(copy, lines, last=True)
        if notify:
            shards = sorted({row["shard"] for row in rows})
            cursor.execute(
                QUERIES["notify_shards"], {"channel": channel, "shards": shards, "priority": params["priority"]}
            )


def flush_chunk(copy: Any, lines: list[str], *, last: bool = False) -> None:
    """Send the COPY lines gathered so far once they fill a chunk (the
    server parses one while the next is formatted), or, ``last``, whatever
    is left."""
    if lines and (last or len(lines) >= COPY_CHUNK):
        copy.write("".join(lines))
        lines.clear()


def limits_field(row: dict[str, Any]) -> str:
    """A row's limit_keys (JSON text or None) as a COPY field."""
    keys = row.get("limit_keys")
    return _COPY_NULL if keys is None else copy_json(keys)


def traceparent_field(row: dict[str, Any]) -> str:
    """A row's traceparent (or None) as a COPY field."""
    value = row.get("traceparent")
    return _COPY_NULL if value is None else copy_text(value)


def fair_fields(row: dict[str, Any], params: dict[str, Any]) -> str:
    """A row's fair_key and fair_weight as two COPY fields (the row's own, else the task's)."""
    key = row["fair_key"] if "fair_key" in row else params.get("fair_key")
    weight = row["fair_weight"] if "fair_weight" in row else params.get("fair_weight")
    return f"{_COPY_NULL if key is None else copy_text(key)}\t{_COPY_NULL if weight is None else weight}"


def tags_field(row: dict[str, Any]) -> str:
    """A row's tags (JSON text or None) as a COPY field."""
    tags = row.get("tags")
    return _COPY_NULL if tags is None else copy_json(tags)


def copy_text(value: str) -> str:
    """``value`` as one field of COPY's text format."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


def copy_json(text: str) -> str:
    """JSON from the backend's dumps as a COPY text field: it escapes every
    control character and non-ASCII one, so only backslashes need doubling."""
    return text.replace("\\", "\\\\") if "\\" in text else text


# copy_workflow_jobs writes job_columns, then these (checked at import).
_WORKFLOW_COLUMNS = ("waiting_on", "children_pending", "workflow")
_copy_workflow = QUERIES["copy_workflow_jobs"]
_WORKFLOW_COPY_COLUMNS = tuple(
    name.strip() for name in _copy_workflow[_copy_workflow.index("(") + 1 : _copy_workflow.index(")")].split(",")
)
if (*JOB_COLUMNS, *_WORKFLOW_COLUMNS) != _WORKFLOW_COPY_COLUMNS:
    raise ImportError(
        f"shardq/db/sql/workflow.sql's copy_workflow_jobs names {_WORKFLOW_COPY_COLUMNS}: it must name job_columns, then "
        + ", ".join(_WORKFLOW_COLUMNS)
    )


def copy_graph(
    alias: str,
    rows: Sequence[dict[str, Any]],
    edges: Sequence[tuple[int, int, str, bool]],
    external: Sequence[int],
    *,
    workflow: str | None,
    notify: bool,
    channel: str,
    name_external: Callable[[dict[int, str]], dict[int, str]],
) -> tuple[list[int], datetime]:
    """Insert a workflow in one atomic block: the jobs that already exist and
    are named as parents (``external``) marked ``children_pending``
    (``link_parents``), then one job per row with one COPY (its own params:
    ``task_path`` ... ``max_attempts``, the job_row fields, ``waiting`` the
    number of its parents, ``has_children``), then the edges with another.
    An edge is (parent, child index, name, run_on_failure), the parent a row
    index when >= 0, else the existing job ``-parent``; its name, for an
    existing parent, comes from ``name_external({id: task_path})``, which
    raises to refuse (an id that does not exist is missing from its
    argument). NOTIFYs the shards of the rows with no parent. Returns the
    ids (in row order) and the enqueue time."""
    conn = connections[alias]
    with transaction.atomic(using=alias), conn.cursor() as cursor:
        names: dict[int, str] = {}
        if external:
            # A finished parent the archiver moved to shardq_job_history comes
            # back first: the resolver moves its new children on from there.
            cursor.execute(QUERIES["restore_history_jobs"], {"ids": list(external)})
            cursor.execute(QUERIES["link_parents"], {"ids": list(external)})
            names = name_external({job_id: path for job_id, path in cursor.fetchall()})
        from ..conf import get_config

        cursor.execute(QUERIES["reserve_job_ids"], {"n": len(rows), "shard_count": get_config().shard_count})
        ids, enqueued_at, shard_count = cursor.fetchone()
        # The cluster's count now (a reshard may have raised it): each row's shard.
        mask = shard_count - 1
        for row in rows:
            row["shard"] = row["key_hash"] & mask
        ids.sort()
        stamp = enqueued_at.isoformat()
        name_field = _COPY_NULL if workflow is None else copy_text(workflow)
        lines: list[str] = []
        with conn.wrap_database_errors, cursor.copy(_copy_workflow) as copy:
            for job_id, row in zip(ids, rows, strict=True):
                key = row["shard_key"]
                run_after = row["run_after"]
                lines.append(
                    f"{job_id}\t{copy_text(row['task_path'])}\t{copy_text(row['backend'])}\t"
                    f"{copy_text(row['queue_name'])}\t{row['priority']}\t"
                    f"{stamp if run_after is None else run_after.isoformat()}\t{row['shard']}\t"
                    f"{row['key_hash']}\t{_COPY_NULL if key is None else copy_text(key)}\t"
                    f"{'t' if row['ordered'] else 'f'}\t{'WAITING' if row['waiting'] else 'READY'}\t0\t0\t0\t"
                    f"{row['max_attempts']}\t{copy_json(row['args'])}\t{copy_json(row['kwargs'])}\t"
                    f"[]\t[]\t{stamp}\t{limits_field(row)}\t{'t' if row.get('key_limited') else 'f'}\t"
                    f"{traceparent_field(row)}\t{fair_fields(row, row)}\t{tags_field(row)}\t{row['waiting']}\t{'t' if row['has_children'] else 'f'}\t{name_field}\n"
                )
                flush_chunk(copy, lines)
            flush_chunk(copy, lines, last=True)
        lines = []
        with conn.wrap_database_errors, cursor.copy(QUERIES["copy_edges"]) as copy:
            for parent, child, name, run_on_failure in edges:
                parent_id = ids[parent] if parent >= 0 else -parent
                if parent < 0:
                    name = names[parent_id]
                lines.append(f"{parent_id}\t{ids[child]}\t{copy_text(name)}\t{'t' if run_on_failure else 'f'}\tf\n")
                flush_chunk(copy, lines)
            flush_chunk(copy, lines, last=True)
        if notify:
            by_priority: dict[int, set[int]] = {}
            for row in rows:
                if not row["waiting"]:
                    by_priority.setdefault(row["priority"], set()).add(row["shard"])
            for priority, shards in sorted(by_priority.items()):
                cursor.execute(
                    QUERIES["notify_shards"], {"channel": channel, "shards": sorted(shards), "priority": priority}
                )
    return ids, enqueued_at
