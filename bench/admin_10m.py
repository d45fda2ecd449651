"""The admin at ten million jobs (issue 27 §2): every page timed server-side.

    DATABASE_URL=... .venv/bin/python bench/admin_10m.py [--rows 10000000] [--requests 20] [--regenerate]

Fills its own database (``--database``, default shardq_admin10m; kept
between runs, refilled with ``--regenerate`` or when its row count differs)
with ``--rows`` jobs in server-side ``INSERT … SELECT generate_series``
chunks, secondary indexes dropped during the fill and rebuilt after (as a
restore would), then ``ANALYZE``. The spread is a month of a busy
deployment: 30 days of enqueue times in id order; eight tasks of
``tests.taskapp`` (so the admin knows them) with skewed shares; four
queues; 96 % SUCCESSFUL, 3 % FAILED of which two thirds dead letters,
and, over the newest 0.5 %, READY (some deferred), CLAIMED and RUNNING jobs;
shard keys ``customer-N`` over 200,000 customers for keyed tasks; keyword
arguments ``customer_id``/``order_id``/``user_id`` and an amount; 20 % of
jobs tagged ``billing``, 1 % also ``vip``. Split as the archiver leaves a
deployment (SHARDQ["HISTORY"] on, HISTORY_DAYS 31): the SUCCESSFUL and the
cancelled (the FAILED that are not dead letters) in shardq_job_history's day
partitions, but the newest 0.01 % (within HISTORY_GRACE); dead letters,
READY, CLAIMED and RUNNING jobs in shardq_job (about 243,000 rows of ten
million).

Then each page is requested ``--requests`` times (after two warm-ups) by
Django's test client in this process, logged in as a superuser: the time is
the server's, from the request to the rendered response (no network, no
browser). The pages: the job list and the job history, each unfiltered,
filtered and searched, a job's page in each, the dashboard and the shard map.
Prints p50/p95/max per page, and the plan of every statement a page runs on
shardq_job or the history (EXPLAIN): a Seq Scan on shardq_job, or on more
than one large history partition, is reported. Writes
bench/results/admin_10m.json.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TARGET_MS = 300.0
CHUNK = 1_000_000
CUSTOMERS = 200_000

# (task path, share, queue, kwargs builder (SQL over g), keyed, tagged)
TASKS = [
    (
        "tests.taskapp.admin_tasks.charge",
        0.30,
        "billing",
        "jsonb_build_object('customer_id', g % 200000, 'amount', g % 1000)",
        True,
        True,
    ),
    ("tests.taskapp.admin_tasks.ship", 0.20, "default", "jsonb_build_object('order_id', g)", True, False),
    (
        "tests.taskapp.tasks.keyed",
        0.20,
        "default",
        "jsonb_build_object('user_id', g % 200000, 'note', 'n')",
        True,
        False,
    ),
    ("tests.taskapp.tasks.noop", 0.15, "default", "'{}'::jsonb", False, False),
    (
        "tests.taskapp.tasks.unique_report",
        0.08,
        "reports",
        "jsonb_build_object('account_id', g % 200000, 'kind', 'daily')",
        True,
        False,
    ),
    (
        "tests.taskapp.tasks.hot_account",
        0.05,
        "emails",
        "jsonb_build_object('account_id', g % 5000, 'n', g)",
        True,
        False,
    ),
    ("tests.taskapp.tasks.add", 0.019, "default", "jsonb_build_object('a', g % 100, 'b', 1)", False, False),
    (
        "tests.taskapp.admin_tasks.sign_in",
        0.001,
        "emails",
        "jsonb_build_object('account', 'user-' || (g % 1000), 'password', 'x')",
        True,
        False,
    ),
]
RARE_TASK = "tests.taskapp.admin_tasks.sign_in"
SECONDARY = [
    "shardq_job_ready_idx",
    "shardq_job_fair_idx",
    "shardq_job_due_idx",
    "shardq_job_inflight_idx",
    "shardq_job_ordered_idx",
    "shardq_job_key_limited_idx",
    "shardq_job_resolve_idx",
    "shardq_job_waiting_idx",
    "shardq_job_suspended_idx",
    "shardq_job_ordered_susp_idx",
    "shardq_job_tags_idx",
    "shardq_job_kwargs_idx",
    "shardq_job_task_idx",
    "shardq_job_key_idx",
    "shardq_job_dead_idx",
    "shardq_job_archivable_idx",
    "shardq_job_history_id_idx",
    "shardq_job_history_task_idx",
    "shardq_job_history_queue_idx",
    "shardq_job_history_status_idx",
    "shardq_job_history_finished_idx",
    "shardq_job_history_key_idx",
    "shardq_job_history_kwargs_idx",
    "shardq_job_history_tags_idx",
]


def fill_sql(offset: int = 0, history: bool = True) -> str:
    """One chunk's INSERT of rows %(lo)s to %(hi)s of %(n)s (ids offset + row;
    the caller substitutes the three numbers: the text holds % operators).
    ``history``: the finished jobs the archiver would have moved go to
    shardq_job_history (its partitions must exist); else every row goes to
    shardq_job (a deployment with SHARDQ["HISTORY"] False)."""
    bounds, acc = [], 0.0
    for path, share, queue, kwargs, keyed, tagged in TASKS:
        acc += share
        bounds.append((acc, path, queue, kwargs, keyed, tagged))

    def case(pick):
        return (
            "CASE "
            + " ".join(f"WHEN r.t < {b[0]:.4f} THEN {pick(b)}" for b in bounds)
            + f" ELSE {pick(bounds[-1])} END"
        )

    task = case(lambda b: f"'{b[1]}'")
    queue = case(lambda b: f"'{b[2]}'")
    kwargs = case(lambda b: b[3])
    key = case(lambda b: "'customer-' || (g % 200000)" if b[4] else "NULL")
    tags = case(
        lambda b: (
            'CASE WHEN g % 100 = 0 THEN \'["billing", "vip"]\'::jsonb ELSE \'["billing"]\'::jsonb END'
            if b[5]
            else "NULL::jsonb"
        )
    )
    columns = (
        "id, task_path, backend, queue_name, priority, run_after, shard, key_hash, shard_key, ordered, status,"
        " status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at, started_at,"
        " last_attempted_at, finished_at, tags"
    )
    # One generated chunk, split as the archiver leaves it: the archivable
    # (SUCCESSFUL, cancelled) go to shardq_job_history, except the newest
    # (still within HISTORY_GRACE); dead letters, READY, CLAIMED and RUNNING
    # stay in shardq_job.
    history_cte = HISTORY_CTE.format(columns=columns) if history else ""
    hot_only = " WHERE NOT archivable OR fresh" if history else ""
    return f"""
    WITH src AS MATERIALIZED (
    SELECT {int(offset)} + g AS id, x.task AS task_path, 'default' AS backend, x.queue AS queue_name, 0 AS priority,
           x.at + CASE WHEN x.status = 'READY' AND g % 10 = 0 THEN interval '2 hours' ELSE interval '0' END AS run_after,
           x.hash & 63 AS shard, x.hash AS key_hash, x.key AS shard_key, false AS ordered, x.status, 3 AS status_rank,
           1 AS fence,
           CASE WHEN x.status IN ('READY', 'CLAIMED') THEN 0 WHEN x.status = 'FAILED' AND g % 3 = 0 THEN 1 ELSE 2 END
               AS attempts,
           CASE WHEN x.status = 'FAILED' AND g % 3 = 0 THEN 3 ELSE 2 END AS max_attempts,
           '[]'::jsonb AS args, x.kwargs,
           CASE WHEN x.status = 'FAILED' AND g % 3 = 0 THEN jsonb_build_array(jsonb_build_object(
                    'exception_class_path', 'shardq.exceptions.Cancelled', 'traceback', ''))
                WHEN x.status = 'FAILED' THEN jsonb_build_array(jsonb_build_object(
                    'exception_class_path', 'builtins.ValueError', 'traceback', 'Traceback: ValueError: bad input'))
               ELSE '[]'::jsonb END AS errors,
           CASE WHEN x.status IN ('READY', 'CLAIMED') THEN '[]'::jsonb ELSE '["w-1"]'::jsonb END AS worker_ids,
           x.at AS enqueued_at,
           CASE WHEN x.status NOT IN ('READY', 'CLAIMED') THEN x.at + interval '40 ms' END AS started_at,
           CASE WHEN x.status NOT IN ('READY', 'CLAIMED') THEN x.at + interval '40 ms' END AS last_attempted_at,
           CASE WHEN x.status IN ('SUCCESSFUL', 'FAILED') THEN x.at + interval '240 ms' END AS finished_at,
           x.tags,
           x.status = 'SUCCESSFUL' OR (x.status = 'FAILED' AND g % 3 = 0) AS archivable,
           g > %(n)s * 0.9999 AS fresh
    FROM generate_series(%(lo)s, %(hi)s) AS g
    CROSS JOIN LATERAL (SELECT (hashint8(g::bigint * 7919) & 1048575)::float8 / 1048576 AS u,
                               power((hashint8(g::bigint * 104729) & 1048575)::float8 / 1048576, 1.6) AS t) AS r
    CROSS JOIN LATERAL (SELECT
        {task} AS task, {queue} AS queue, {kwargs} AS kwargs, {key} AS key, {tags} AS tags,
        hashint8(g) AS hash,
        now() - interval '30 days' * (1 - g::float8 / %(n)s) AS at,
        CASE WHEN g > %(n)s * 0.995 THEN
                 CASE WHEN r.u < 0.70 THEN 'READY' WHEN r.u < 0.75 THEN 'CLAIMED'
                      WHEN r.u < 0.85 THEN 'RUNNING' WHEN r.u < 0.97 THEN 'SUCCESSFUL' ELSE 'FAILED' END
             WHEN r.u < 0.97 THEN 'SUCCESSFUL' ELSE 'FAILED' END AS status) AS x
    ){history_cte}
    INSERT INTO shardq_job ({columns})
    SELECT {columns} FROM src{hot_only}
    """


HISTORY_CTE = """, history AS (
        -- (LIKE shardq_job) copies no column default: the defaulted ones are named.
        INSERT INTO shardq_job_history ({columns}, worker_losses, children_pending, waiting_on, key_limited)
        SELECT {columns}, 0, false, 0, false FROM src WHERE archivable AND NOT fresh
    )"""


def generate(conn, rows: int, say) -> None:
    import psycopg

    # The definitions are kept in a table of their own first, so a fill
    # that stops half-way (^C) still rebuilds every index the next time.
    conn.execute("CREATE TABLE IF NOT EXISTS bench_index_definitions (name text PRIMARY KEY, definition text)")
    conn.execute(
        "INSERT INTO bench_index_definitions SELECT indexname, indexdef FROM pg_indexes"
        " WHERE tablename IN ('shardq_job', 'shardq_job_history') AND indexname = ANY(%s)"
        " ON CONFLICT (name) DO NOTHING",
        [SECONDARY],
    )
    definitions = dict(conn.execute("SELECT name, definition FROM bench_index_definitions").fetchall())
    conn.execute("TRUNCATE shardq_job CASCADE")
    conn.execute("TRUNCATE shardq_job_history")
    # A day's partition for each of the 30 days (and one ahead), as the
    # archiver keeps them with SHARDQ["HISTORY_DAYS"] = 31.
    from shardq.db.store import WorkerStore

    store = WorkerStore()
    store.maintain_history(keep_seconds=31 * 86400, width_seconds=86400, ahead_seconds=86400)
    for name in definitions:
        conn.execute(f"DROP INDEX IF EXISTS {name}")
    conn.execute("SET synchronous_commit = off")
    conn.execute("SET maintenance_work_mem = '512MB'")
    sql = fill_sql()
    started = time.perf_counter()
    for lo in range(1, rows + 1, CHUNK):
        hi = min(rows, lo + CHUNK - 1)
        conn.execute(sql.replace("%(lo)s", str(lo)).replace("%(hi)s", str(hi)).replace("%(n)s", str(rows)))
        say(f"filled {hi:,} rows ({time.perf_counter() - started:.0f} s)")
    conn.execute("SELECT setval(pg_get_serial_sequence('shardq_job', 'id'), %s)", [rows])
    for name, definition in definitions.items():
        t = time.perf_counter()
        try:
            # pg_indexes writes a partitioned table's index "ON ONLY" (the
            # parent's alone, invalid until each partition's is attached):
            # rebuilt without ONLY, it is built on every partition.
            definition = definition.replace(" ON ONLY ", " ON ", 1)
            conn.execute(definition.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
        except psycopg.Error as exc:
            raise RuntimeError(f"rebuilding {name}: {exc}") from exc
        say(f"index {name} rebuilt in {time.perf_counter() - t:.0f} s")
    conn.execute("VACUUM (ANALYZE) shardq_job")
    conn.execute("VACUUM (ANALYZE) shardq_job_history")
    say(f"generated {rows:,} rows in {time.perf_counter() - started:.0f} s")


def pages(conn, rows: int) -> list[tuple[str, str]]:
    """(name, URL) of every page timed."""
    from urllib.parse import quote

    day, next_day, week = (
        quote(t.isoformat())
        for t in conn.execute(
            "SELECT date_trunc('day', now() - interval '10 days'), date_trunc('day', now() - interval '9 days'),"
            " date_trunc('day', now() - interval '7 days')"
        ).fetchone()
    )
    customer = 777
    # A job of each table near the first third of the month.
    (some_id,) = conn.execute("SELECT min(id) FROM shardq_job WHERE id >= %s", [rows // 3]).fetchone() or (rows // 3,)
    (old_id,) = conn.execute(
        "SELECT id FROM shardq_job_history WHERE id >= %s ORDER BY id LIMIT 1", [rows // 3]
    ).fetchone() or (rows // 3,)
    h = "/admin/shardq/jobhistory/"
    history = [
        ("history list", h),
        ("history status SUCCESSFUL", f"{h}?status__exact=SUCCESSFUL"),
        ("history status FAILED (cancelled)", f"{h}?status__exact=FAILED"),
        ("history task (30 %)", f"{h}?task=tests.taskapp.admin_tasks.charge"),
        ("history task (0.1 %)", f"{h}?task={RARE_TASK}"),
        ("history queue reports", f"{h}?queue=reports"),
        ("history past 7 days", f"{h}?finished_at__gte={week}"),
        ("history one day, 10 days ago", f"{h}?finished_at__gte={day}&finished_at__lt={next_day}"),
        ("history tag billing (20 %)", f"{h}?tag=billing"),
        ("history tag vip (0.2 %)", f"{h}?tag=vip"),
        ("history task + status FAILED", f"{h}?task=tests.taskapp.admin_tasks.charge&status__exact=FAILED"),
        ("history search id", f"{h}?q={old_id}"),
        ("history search shard key", f"{h}?q=customer-{customer}"),
        ("history search customer_id=777", f"{h}?q=customer_id={customer}"),
        ("history search account_id=777 (2 tasks)", f"{h}?q=account_id={customer}"),
        ("history job page", f"{h}{old_id}/change/"),
    ]
    return [
        ("job list", "/admin/shardq/job/"),
        ("status SUCCESSFUL", "/admin/shardq/job/?status__exact=SUCCESSFUL"),
        ("status FAILED", "/admin/shardq/job/?status__exact=FAILED"),
        ("status READY", "/admin/shardq/job/?status__exact=READY"),
        ("status RUNNING", "/admin/shardq/job/?status__exact=RUNNING"),
        ("task (30 %)", "/admin/shardq/job/?task=tests.taskapp.admin_tasks.charge"),
        ("task (0.1 %)", f"/admin/shardq/job/?task={RARE_TASK}"),
        ("queue reports", "/admin/shardq/job/?queue=reports"),
        ("dead letters", "/admin/shardq/job/?dead_letter=yes"),
        ("dead letters, page 20", "/admin/shardq/job/?dead_letter=yes&p=20"),
        ("past 7 days", f"/admin/shardq/job/?enqueued_at__gte={week}"),
        ("one day, 10 days ago", f"/admin/shardq/job/?enqueued_at__gte={day}&enqueued_at__lt={next_day}"),
        ("tag billing (20 %)", "/admin/shardq/job/?tag=billing"),
        ("tag vip (0.2 %)", "/admin/shardq/job/?tag=vip"),
        ("task + status FAILED", "/admin/shardq/job/?task=tests.taskapp.admin_tasks.charge&status__exact=FAILED"),
        ("search id", f"/admin/shardq/job/?q={some_id}"),
        ("search shard key", f"/admin/shardq/job/?q=customer-{customer}"),
        ("search customer_id=777", f"/admin/shardq/job/?q=customer_id={customer}"),
        ("search account_id=777 (2 tasks)", f"/admin/shardq/job/?q=account_id={customer}"),
        ("job page", f"/admin/shardq/job/{some_id}/change/"),
        ("dashboard", "/admin/shardq/dashboard/"),
        ("shard map", "/admin/shardq/shard/"),
        *history,
    ]


def seq_scans(sql_statements: list[str]) -> list[str]:
    """The statements among ``sql_statements`` whose plan has a Seq Scan on
    shardq_job, or on more than one partition of shardq_job_history holding
    over 1 % of its rows."""
    from django.db import connection

    found = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'shardq_job_history'::regclass"
            " AND c.reltuples > 0.01 * (SELECT sum(GREATEST(x.reltuples, 0)) FROM pg_class AS x"
            " JOIN pg_inherits AS y ON y.inhrelid = x.oid AND y.inhparent = 'shardq_job_history'::regclass)"
        )
        large = {row[0] for row in cursor.fetchall()}
    for statement in sql_statements:
        if "shardq_job" not in statement or not statement.lstrip().upper().startswith("SELECT"):
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + statement)
            document = cursor.fetchone()[0]
        plan = json.loads(document) if isinstance(document, str) else document
        stack, partitions = [plan[0]["Plan"]], set()
        while stack:
            node = stack.pop()
            if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "shardq_job":
                found.append(statement[:160])
                break
            if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in large:
                partitions.add(node["Relation Name"])
            stack.extend(node.get("Plans", []))
        if len(partitions) > 1:
            found.append(f"{len(partitions)} history partitions: {statement[:160]}")
    return found


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/admin_10m.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--database", default="shardq_admin10m")
    p.add_argument("--regenerate", action="store_true")
    p.add_argument("--fill-only", action="store_true", help="fill (when needed) and stop: no page timed")
    p.add_argument("--only", help="time only the pages whose name holds this text")
    p.add_argument("--skip", action="append", default=[], help="skip the pages whose name holds this text")
    args = p.parse_args()
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import psycopg
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection, connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from bench import e2e

    url = e2e.bench_database(args.database)
    connections["default"].close()
    connections["default"].settings_dict["NAME"] = args.database
    settings.ALLOWED_HOSTS = ["*"]  # the test client's "testserver"

    def say(text):
        print(text, flush=True)

    with psycopg.connect(url, autocommit=True) as conn:
        estimate = conn.execute(
            "SELECT sum(GREATEST(c.reltuples, 0))::bigint FROM pg_class AS c WHERE c.relname = 'shardq_job'"
            " OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'shardq_job_history'::regclass)"
        ).fetchone()[0]
        if args.regenerate or abs(estimate - args.rows) > args.rows * 0.02:
            generate(conn, args.rows, say)
        else:
            say(f"reusing {estimate:,} rows (estimated) in {args.database}")
        table = conn.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('shardq_job')), pg_size_pretty(pg_relation_size('shardq_job'))"
        ).fetchone()
        indexes = conn.execute(
            "SELECT indexrelname, pg_size_pretty(pg_relation_size(indexrelid)) FROM pg_stat_user_indexes"
            " WHERE relname = 'shardq_job' ORDER BY pg_relation_size(indexrelid) DESC"
        ).fetchall()
        page_list = pages(conn, args.rows)
    if args.fill_only:
        return
    User = get_user_model()
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "b@example.com", "x")
    client = Client()
    client.force_login(user)
    results = []
    for name, path in page_list:
        if (args.only and args.only not in name) or any(text in name for text in args.skip):
            continue
        for _ in range(2):
            response = client.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"{name}: {path} answered {response.status_code}: {response.content[:500]!r}")
        times, cpu = [], []
        for _ in range(args.requests):
            started, started_cpu = time.perf_counter(), time.process_time()
            client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            # This process's CPU (Django, the template): the part of a
            # request that waits for no one, so a loaded box inflates it
            # little, unlike the wall time.
            cpu.append((time.process_time() - started_cpu) * 1000)
        with CaptureQueriesContext(connection) as captured:
            client.get(path)
        scans = seq_scans([q["sql"] for q in captured.captured_queries])
        sql_ms = sum(float(q["time"]) for q in captured.captured_queries) * 1000
        times.sort()
        p95 = times[max(0, round(0.95 * len(times)) - 1)]
        row = {
            "page": name,
            "path": path,
            "p50_ms": statistics.median(times),
            "p95_ms": p95,
            "max_ms": times[-1],
            "statements": len(captured.captured_queries),
            "sql_ms": sql_ms,
            "cpu_p50_ms": statistics.median(cpu),
            "seq_scans": scans,
            "load": os.getloadavg()[0],
        }
        results.append(row)
        mark = "ok" if p95 <= TARGET_MS else "OVER"
        say(
            f"{name:34} p50 {row['p50_ms']:7.1f} ms  p95 {p95:7.1f} ms  max {times[-1]:7.1f} ms  {mark:4}"
            f"  cpu p50 {row['cpu_p50_ms']:6.1f} ms  {len(captured.captured_queries)} statements ({sql_ms:.0f} ms in SQL){'  SEQ SCAN: ' + '; '.join(scans) if scans else ''}"
            f"  load {row['load']:.2f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"rows": args.rows, "table": table, "indexes": indexes, "pages": results, "target_ms": TARGET_MS}
    (RESULTS / "admin_10m.json").write_text(json.dumps(out, indent=2, default=str))
    say(f"table {table[0]} (heap {table[1]}); indexes: " + ", ".join(f"{n} {s}" for n, s in indexes))
    print(
        "\n| page | p50 ms | p95 ms | max ms | CPU p50 ms | SQL ms (one request) | ≤ 300 ms | Seq Scan on shardq_job |"
        "\n|---|---:|---:|---:|---:|---:|---|---|"
    )
    for r in results:
        print(
            f"| {r['page']} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['max_ms']:.0f} | {r['cpu_p50_ms']:.0f} | {r['sql_ms']:.0f} | "
            f"{'yes' if r['p95_ms'] <= TARGET_MS else '**no**'} | {'**yes**' if r['seq_scans'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
