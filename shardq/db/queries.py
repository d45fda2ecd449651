"""Loads shardq's SQL: every ``shardq/db/sql/*.sql`` file (one a table, as
River keeps its statements), one dict entry per ``-- name:`` block, names
unique across the files.

How a file is written:

- ``-- name: NAME`` starts a block; the comment lines right after it say
  what it does (they are not part of the statement).
- Parameters are psycopg's ``%(name)s``; a literal percent sign is ``%%``.
  A statement that reads the time takes ``coalesce(%(now)s::timestamptz,
  clock_timestamp())`` where a test may move the clock (``now`` None: the
  database's own).
- A block may be an SQL expression that others include as ``{{NAME}}`` (in
  parentheses), so a definition is written once; ``{{NAME*}}`` includes it
  bare (a column list that goes on, a CTE's body). An include may name a
  block of another file.
- Comment lines before a file's first block describe the file.
"""

import re
from pathlib import Path

# A block written {{name}} inside another is that block, in parentheses: an
# expression (a definition such as worker_liveness) is written once.
# {{name*}} is the block as it is, with no parentheses: a list that another
# list continues (a column list with more columns after it).
INCLUDE = re.compile(r"\{\{(\w+)(\*?)\}\}")


SQL_DIR = Path(__file__).with_name("sql")


def blocks(path: Path) -> dict[str, str]:
    """The blocks of one file, by name, as written (includes not expanded)."""
    queries: dict[str, str] = {}
    name = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        if name in queries:
            raise ValueError(f"{path.name}: two blocks are named {name!r}")
        # Comment lines after the statement say something of the next block.
        while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("--")):
            lines.pop()
        queries[name] = "\n".join(lines).strip().rstrip(";")

    for line in path.read_text().splitlines():
        if line.startswith("-- name:"):
            close()
            name, lines = line.split(":", 1)[1].strip(), []
        elif name and not (line.startswith("--") and not lines):
            # (a block's leading comment lines are its description)
            lines.append(line)
    close()
    return queries


def load(*paths: Path) -> dict[str, str]:
    """Every block of ``paths``, its includes expanded (across the files)."""
    queries: dict[str, str] = {}
    for path in paths:
        for name, text in blocks(path).items():
            if name in queries:
                raise ValueError(f"{path.name}: a block named {name!r} is in another file too")
            queries[name] = text
    return {name: expand(text, queries) for name, text in queries.items()}


def sql_files() -> list[Path]:
    return sorted(SQL_DIR.glob("*.sql"))


def expand(text: str, queries: dict[str, str], seen: tuple[str, ...] = ()) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in queries:
            raise KeyError(f"shardq/db/sql: {{{{{name}}}}} names no block")
        if name in seen:
            raise ValueError(f"shardq/db/sql: {{{{{name}}}}} includes itself")
        text = expand(queries[name], queries, (*seen, name))
        return text if match.group(2) else "(" + text + ")"

    return INCLUDE.sub(include, text)


PARAMETER = re.compile(r"%\((\w+)\)s")


def positional(name: str, params: dict[str, object]) -> tuple[str, list[object]]:
    """Block ``name`` with its ``%(x)s`` parameters as ``%s`` and their
    values in order, for Django's ``RawSQL`` (which takes a list)."""
    text = QUERIES[name]
    return PARAMETER.sub("%s", text), [params[p] for p in PARAMETER.findall(text)]


QUERIES = load(*sql_files())

# psycopg parses a statement's %(name)s placeholders on every execute, and
# caches the result only for statements up to this many bytes (its
# MAX_CACHED_STATEMENT_LENGTH): claim_jobs, at about 11 kB, was parsed again
# on each claim (3% of a no-op drain's worker CPU, measured).
CACHED_STATEMENT_BYTES = 4096

RAW_TOKEN = re.compile(r"%%|%\((\w+)\)s")


def raw(text: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with its ``%(x)s`` parameters as PostgreSQL's ``$n`` (one
    number per name, in order of first use) and ``%%`` as ``%``, and the
    names in that order: a statement for psycopg's ``RawCursor``, which
    sends it as it is."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return RAW_TOKEN.sub(number, text), tuple(names)


# The statements psycopg would parse on every execute: run as raw statements.
# A long block with no parameter (job_problem, a fragment the claims include)
# is never sent alone, and psycopg has nothing to parse in it.
RAW_QUERIES = {
    name: raw(text)
    for name, text in QUERIES.items()
    if len(text.encode()) > CACHED_STATEMENT_BYTES and RAW_TOKEN.search(text) and "%(" in text
}

# claim_jobs' :min_priority that leaves no job out: the least smallint (a row
# written by hand may hold a priority below Django's -100).
ANY_PRIORITY = -32768
