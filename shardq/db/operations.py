"""Named statements on a Django connection: what management commands, the
admin and transactional completion run (the worker's own statements run on
its psycopg connections through ``store.WorkerStore``).

Every statement is a named block of ``shardq/db/sql/``; callers name it and pass
parameters, and never hold SQL text of their own.
"""

from typing import Any, Literal

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field
from django.db.models.expressions import RawSQL

from .errors import missing_tables_named
from .queries import QUERIES, positional


def run(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    using: str = DEFAULT_DB_ALIAS,
    fetch: Literal["all", "one", "none"] = "all",
    named: bool = False,
) -> Any:
    """Run the named statement on ``using``'s connection (inside the caller's
    transaction, if any): every row, the first row (None: none), or the row
    count. ``named``: rows as dicts keyed by the statement's column names."""
    with missing_tables_named(), connections[using].cursor() as cursor:
        cursor.execute(QUERIES[name], params or {})
        if fetch == "none":
            return cursor.rowcount
        rows = cursor.fetchall() if fetch == "all" else [row for row in [cursor.fetchone()] if row is not None]
        if named:
            names = [column.name for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in rows]
        if fetch == "all":
            return rows
        return rows[0] if rows else None


def expression(name: str, params: dict[str, Any], output_field: Field) -> RawSQL:
    """The named block ``name`` (an expression over the queried table's row)
    as a Django expression for a queryset's ``annotate``, its parameters
    bound: the admin's bounded columns and liveness."""
    text, values = positional(name, params)
    return RawSQL(text, values, output_field=output_field)
