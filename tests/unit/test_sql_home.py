"""SQL lives in shardq/db (issue 11): statements are named blocks of shardq/db/sql/*.sql,
run by shardq/db/store.py (the worker's connections) or
shardq/db/operations.py (a Django connection). This test fails when a module
elsewhere in the package runs SQL itself.

None does: the enqueue path's prepared INSERT and bulk COPY run through
shardq/db/enqueue.py, the listener's LISTEN through store.listen, and the
admin's SQL expressions (a queryset's ``RawSQL`` annotations) are blocks too,
built by shardq.db.operations.expression.
"""

import re
from pathlib import Path

import shardq

PACKAGE = Path(shardq.__file__).resolve().parent

# What running SQL looks like in this code base: a cursor or connection
# executing, COPY, a named statement looked up, a Django cursor opened, SQL
# text in a queryset (RawSQL, raw, extra).
RUNS_SQL = re.compile(
    r"QUERIES\[|cursor\.execute\(|conn\.execute\(|cursor\.copy\(|connection\.cursor\(|\]\.cursor\(|\.raw\(|\.extra\("
    r"|\bRawSQL\b"
)


def offenders() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(("db/", "migrations/")):
            continue
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            for match in RUNS_SQL.finditer(code):
                found.setdefault(relative, set()).add(match.group(0))
    return found


def test_no_module_outside_shardq_db_runs_sql():
    extra = {module: sorted(kinds) for module, kinds in offenders().items()}
    assert extra == {}, (
        f"SQL run outside shardq/db: {extra}. Add a named block to a file of shardq/db/sql/ and run it "
        "through shardq.db.operations.run (a Django connection) or WorkerStore (a worker's), or build "
        "an expression of it with shardq.db.operations.expression."
    )


def test_the_pattern_sees_sql_run_the_usual_ways(tmp_path):
    sample = 'with connection.cursor() as cursor:\n    cursor.execute(QUERIES["get_job"], {})\n'
    assert {m.group(0) for m in RUNS_SQL.finditer(sample)} == {"connection.cursor(", "cursor.execute(", "QUERIES["}
    annotation = 'from django.db.models.expressions import RawSQL\nqs.annotate(n=RawSQL("SELECT 1", []))\n'
    assert [m.group(0) for m in RUNS_SQL.finditer(annotation)] == ["RawSQL", "RawSQL"]
