"""Loads ``queries.sql``: one dict entry per ``-- name:`` block."""

from pathlib import Path


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
            lines.append(line)
    if name:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


QUERIES = load(Path(__file__).with_name("queries.sql"))

# claim_jobs' :min_priority that leaves no job out: the least smallint (a row
# written by hand may hold a priority below Django's -100).
ANY_PRIORITY = -32768
