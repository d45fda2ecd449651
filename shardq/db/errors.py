"""Driver errors that mean something to a shardq user, recognised by SQLSTATE
wherever shardq's statements run: the worker's store, and the statements run
on a Django connection (enqueue, the commands, the admin), whose
``DatabaseError`` carries the driver's error as its ``__cause__``."""

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError

from ..exceptions import TablesMissing

# PostgreSQL's undefined_table.
UNDEFINED_TABLE = "42P01"


def tables_missing(exc: BaseException) -> TablesMissing | None:
    """``TablesMissing`` when ``exc`` (or the driver error it wraps) is
    undefined_table on one of shardq's relations; None otherwise (a table
    of the project's own is the project's error, left as it is)."""
    seen: BaseException | None = exc
    for _ in range(3):  # the exception, Django's wrapper's cause, ...
        if seen is None:
            return None
        if getattr(seen, "sqlstate", None) == UNDEFINED_TABLE:
            first_line = str(seen).splitlines()[0] if str(seen) else ""
            if "shardq_" in first_line:
                return TablesMissing(first_line)
            return None
        seen = seen.__cause__
    return None


@contextlib.contextmanager
def missing_tables_named() -> Iterator[None]:
    """Around statements on a Django connection: a missing shardq table
    raises ``TablesMissing`` ("run manage.py migrate") instead of the
    driver's ``ProgrammingError``."""
    try:
        yield
    except DatabaseError as exc:
        missing = tables_missing(exc)
        if missing is None:
            raise
        raise missing from exc
