"""The job list's plans (issue 27 §2): every statement the admin's job list
runs on shardq_job, filtered or searched as an operator does, is EXPLAINed
over 300,000 analyzed jobs spread as bench/admin_10m.py spreads ten million
(a month of a busy deployment), and none reads the whole table (no Seq Scan
on shardq_job); the list's count is the planner's estimate or a bounded one,
never a COUNT(*) over every matching row. The timings at ten million rows
are bench/admin_10m.py's (make bench-admin)."""

import json

import pytest
from django.contrib.admin.sites import site
from django.contrib.messages.storage.fallback import FallbackStorage
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.admin_10m import RARE_TASK, fill_sql
from shardq.models import Job

ROWS = 300_000
OFFSET = 10**12  # ids far above any the sequence hands out


@pytest.fixture(scope="module")
def month_of_jobs(django_db_setup, django_db_blocker):
    """ROWS jobs as bench/admin_10m.py makes them, analyzed: written once
    for the module (committed), deleted after it."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(
                fill_sql(OFFSET).replace("%(lo)s", "1").replace("%(hi)s", str(ROWS)).replace("%(n)s", str(ROWS))
            )
            cursor.execute("ANALYZE shardq_job")
        yield
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM shardq_job WHERE id > %s", [OFFSET])
            cursor.execute("ANALYZE shardq_job")


def pages() -> list[str]:
    some_id = OFFSET + ROWS // 3
    return [
        "",
        "status__exact=SUCCESSFUL",
        "status__exact=FAILED",
        "status__exact=READY",
        "status__exact=RUNNING",
        "task=tests.taskapp.admin_tasks.charge",
        f"task={RARE_TASK}",
        "queue=reports",
        "dead_letter=yes",
        "enqueued_at__gte=2000-01-01T00:00:00%2B00:00",
        "tag=billing",
        "tag=vip",
        "task=tests.taskapp.admin_tasks.charge&status__exact=FAILED",
        f"q={some_id}",
        "q=customer-777",
        "q=customer_id=777",
        "q=account_id=777",
    ]


def plan_nodes(statement: str, params) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        document = cursor.fetchone()[0]
    plan = json.loads(document) if isinstance(document, str) else document
    nodes, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    return nodes


def statements_of(rf, admin_user, query: str) -> list[tuple[str, list]]:
    """The SELECTs on shardq_job the job list at ``?query`` runs, with their parameters."""
    request = rf.get(f"/admin/shardq/job/?{query}")
    request.user = admin_user
    request.session = {}
    request._messages = FallbackStorage(request)
    ran: list[tuple[str, list]] = []

    def keep(execute, sql, params, many, context):
        if "shardq_job" in sql and sql.lstrip().upper().startswith("SELECT"):
            ran.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        response = site._registry[Job].changelist_view(request)
        response.render()
    assert response.status_code == 200, response.content[:300]
    return ran


@pytest.mark.parametrize("query", pages())
def test_the_job_list_reads_no_whole_table_filtered_or_searched(month_of_jobs, db, rf, admin_user, query):
    ran = statements_of(rf, admin_user, query)
    assert ran, "the list ran no statement on shardq_job"
    for sql, params in ran:
        nodes = plan_nodes(sql, params)
        summary = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "shardq_job"], (
            query,
            sql[:300],
            summary,
        )
        if sql.lstrip().upper().startswith("SELECT COUNT("):
            assert " LIMIT " in sql.upper(), f"an unbounded count: {sql[:300]}"


def test_the_job_list_over_a_month_of_jobs_says_about_how_many(month_of_jobs, db, rf, admin_user):
    with CaptureQueriesContext(connection) as captured:
        request = rf.get("/admin/shardq/job/")
        request.user = admin_user
        request.session = {}
        request._messages = FallbackStorage(request)
        response = site._registry[Job].changelist_view(request)
        response.render()
    page = response.content.decode()
    assert "about " in page and 'class="shardq-estimated"' in page
    # One count, bounded: it stops at 1,001 rows (then the planner's estimate).
    counts = [q["sql"] for q in captured.captured_queries if q["sql"].upper().startswith("SELECT COUNT(")]
    assert len(counts) == 1 and "LIMIT 1001" in counts[0].upper(), counts
