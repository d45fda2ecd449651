"""Loads ``queries.sql``: one dict entry per ``-- name:`` block."""

import re
from pathlib import Path

# A block written {{name}} inside another is that block, in parentheses: an
# expression (a definition such as worker_liveness) is written once.
# {{name*}} is the block as it is, with no parentheses: a list that another
# list continues (a column list with more columns after it).
INCLUDE = re.compile(r"\{\{(\w+)(\*?)\}\}")


def load(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    name = None
    lines: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("-- name:"):
            if name:
                queries[name] = "\n".join(lines).strip().rstrip(";")
            name, lines = line.split(":", 1)[1].strip(), []
        elif name and not (line.startswith("--") and not lines):
            # (a block's leading comment lines are its description)
            lines.append(line)
    if name:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return {name: expand(text, queries) for name, text in queries.items()}


def expand(text: str, queries: dict[str, str], seen: tuple[str, ...] = ()) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in queries:
            raise KeyError(f"queries.sql: {{{{{name}}}}} names no block")
        if name in seen:
            raise ValueError(f"queries.sql: {{{{{name}}}}} includes itself")
        text = expand(queries[name], queries, (*seen, name))
        return text if match.group(2) else "(" + text + ")"

    return INCLUDE.sub(include, text)


PARAMETER = re.compile(r"%\((\w+)\)s")


def positional(name: str, params: dict[str, object]) -> tuple[str, list[object]]:
    """Block ``name`` with its ``%(x)s`` parameters as ``%s`` and their
    values in order, for Django's ``RawSQL`` (which takes a list)."""
    text = QUERIES[name]
    return PARAMETER.sub("%s", text), [params[p] for p in PARAMETER.findall(text)]


QUERIES = load(Path(__file__).with_name("queries.sql"))

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
RAW_QUERIES = {name: raw(text) for name, text in QUERIES.items() if len(text.encode()) > CACHED_STATEMENT_BYTES}

# claim_jobs' :min_priority that leaves no job out: the least smallint (a row
# written by hand may hold a priority below Django's -100).
ANY_PRIORITY = -32768
