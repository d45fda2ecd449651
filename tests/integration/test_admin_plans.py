"""The job list's and the job history's plans (issue 27 §2): every statement
the admin's job list runs on shardq_job, and the history list on
shardq_job_history, filtered or searched as an operator does, is EXPLAINed
over 300,000 analyzed jobs spread as bench/admin_10m.py spreads ten million
(a month of a busy deployment; for the job list all in shardq_job, as with
SHARDQ["HISTORY"] False, its worst case), and none reads the whole table (no
Seq Scan on shardq_job, none on every partition of the history); the list's
count is the planner's estimate or a bounded one, never a COUNT(*) over
every matching row. The timings at ten million rows are bench/admin_10m.py's
(make bench-admin)."""

import json
import statistics

import pytest
from django.contrib.admin.sites import site
from django.contrib.messages.storage.fallback import FallbackStorage
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.admin_10m import RARE_TASK, fill_sql
from shardq.db.store import WorkerStore
from shardq.models import Job, JobHistory
from tests.helpers import indexes_built_after

ROWS = 300_000
OFFSET = 10**12  # ids far above any the sequence hands out
HISTORY_OFFSET = 2 * 10**12  # the history's month (and its few jobs left in shardq_job)


@pytest.fixture(scope="module")
def month_of_jobs(django_db_setup, django_db_blocker):
    """ROWS jobs as bench/admin_10m.py makes them (its secondary indexes
    built after the fill, as there), analyzed: written once for the module
    (committed), deleted after it."""
    with django_db_blocker.unblock():
        with indexes_built_after("shardq_job"), connection.cursor() as cursor:
            cursor.execute(
                fill_sql(OFFSET, history=False)
                .replace("%(lo)s", "1")
                .replace("%(hi)s", str(ROWS))
                .replace("%(n)s", str(ROWS))
            )
        with connection.cursor() as cursor:  # with the indexes: ANALYZE reads their expressions too
            cursor.execute("ANALYZE shardq_job")
        yield
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM shardq_job WHERE id > %s AND id < %s", [OFFSET, HISTORY_OFFSET])
            cursor.execute("ANALYZE shardq_job")


@pytest.fixture(scope="module")
def month_of_history(django_db_setup, django_db_blocker):
    """ROWS jobs as bench/admin_10m.py makes them, the finished ones in
    shardq_job_history (a day's partition each, as the archiver keeps them
    with HISTORY_DAYS 31), analyzed; deleted after the module, with the
    partitions it made."""
    with django_db_blocker.unblock():
        store = WorkerStore()
        before = {p["name"] for p in store.history_partitions()}
        store.maintain_history(keep_seconds=31 * 86400, width_seconds=86400, ahead_seconds=86400)
        store.close()
        # The indexes kept up as the rows go in: shardq_job takes only the
        # few unfinished and dead jobs (beside the month month_of_jobs may
        # have written), and building the history's again, partition by
        # partition, took longer than keeping them (41-66 s against 21-47 s).
        with connection.cursor() as cursor:
            cursor.execute(
                fill_sql(HISTORY_OFFSET).replace("%(lo)s", "1").replace("%(hi)s", str(ROWS)).replace("%(n)s", str(ROWS))
            )
            cursor.execute("ANALYZE shardq_job_history")
            cursor.execute("ANALYZE shardq_job")
        yield
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM shardq_job WHERE id > %s", [HISTORY_OFFSET])
            cursor.execute("DELETE FROM shardq_job_history WHERE id > %s", [HISTORY_OFFSET])
            for partition in {p["name"] for p in store.history_partitions()} - before:
                cursor.execute(f'DROP TABLE "{partition}"')
            cursor.execute("ANALYZE shardq_job")
        store.close()


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


def statements_of(rf, admin_user, query: str, model=Job) -> list[tuple[str, list]]:
    """The SELECTs on shardq_job (or shardq_job_history) the job list (or
    the history list) at ``?query`` runs, with their parameters."""
    request = rf.get(f"/admin/shardq/{model._meta.model_name}/?{query}")
    request.user = admin_user
    request.session = {}
    request._messages = FallbackStorage(request)
    ran: list[tuple[str, list]] = []

    def keep(execute, sql, params, many, context):
        if "shardq_job" in sql and sql.lstrip().upper().startswith("SELECT"):
            ran.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        response = site._registry[model].changelist_view(request)
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


@pytest.mark.parametrize(
    "search",
    [
        {"where": {"customer_id": 777}},
        {"where": {"amount": 5}},  # about one job in a thousand: more than a page's worth at ten million
        {"task": "tests.taskapp.admin_tasks.charge", "where": {"customer_id": 777}, "status": "FAILED"},
    ],
)
def test_an_argument_search_takes_the_matching_ids_first_then_the_page(month_of_jobs, db, search):
    """shardq_job_kwargs_idx leaves out the jobs in flight (0028), so a search
    reads them through shardq_job_inflight_idx, and both branches' ids come
    first (an InitPlan): the page is then primary-key probes of those ids,
    never a walk of the primary key newest first testing each row (what the
    planner chose over an OR of the two at ten million rows: 8.8 s)."""
    import shardq

    queryset = shardq.jobs(**search)[:100]
    statement, params = queryset.query.sql_with_params()
    nodes = plan_nodes(statement, params)
    summary = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name"), n.get("Index Cond")) for n in nodes]
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], summary
    indexes = {n.get("Index Name") for n in nodes}
    assert {"shardq_job_kwargs_idx", "shardq_job_inflight_idx"} <= indexes, summary
    # The rows of the page: the ids as an index condition, not a filter of a walk.
    outer = [n for n in nodes if n.get("Relation Name") == "shardq_job" and n.get("Alias") == "shardq_job"]
    assert outer and all("ANY" in (n.get("Index Cond") or n.get("Recheck Cond") or "") for n in outer), summary


def history_pages() -> list[str]:
    some_id = HISTORY_OFFSET + ROWS // 3
    return [
        "",
        "status__exact=SUCCESSFUL",
        "status__exact=FAILED",
        "task=tests.taskapp.admin_tasks.charge",
        f"task={RARE_TASK}",
        "queue=reports",
        "tag=billing",
        "tag=vip",
        "task=tests.taskapp.admin_tasks.charge&status__exact=FAILED",
        f"q={some_id}",
        "q=customer-777",
        "q=customer_id=777",
        "q=account_id=777",
        "OLD_DAY",
        "RECENT_WEEK",
    ]


def history_query(query: str) -> str:
    """``query``, with the two date ranges (finished_at, the partition key) filled in."""
    from urllib.parse import quote

    from django.utils import timezone

    now = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    if query == "OLD_DAY":
        low, high = now - timezone.timedelta(days=10), now - timezone.timedelta(days=9)
        return f"finished_at__gte={quote(low.isoformat())}&finished_at__lt={quote(high.isoformat())}"
    if query == "RECENT_WEEK":
        return f"finished_at__gte={quote((now - timezone.timedelta(days=7)).isoformat())}"
    return query


def small_partitions(partitions: list[dict]) -> set[str]:
    """The history partitions a plan may read whole: the nearly empty ones
    (the one made ahead), and the month's partial days. The window ends now,
    so its first and last days hold the time of day's share of a day: on a
    few thousand rows the planner may rightly read the table (the dashboard's
    last hour at 10:44 read today's, 45 % of a day). Every whole day is
    checked."""
    small = {p["name"] for p in partitions if p["estimated_rows"] < ROWS / 100}
    day = statistics.median(p["estimated_rows"] for p in partitions if p["estimated_rows"] >= ROWS / 100)
    return small | {p["name"] for p in partitions if p["estimated_rows"] < 0.9 * day}


@pytest.mark.parametrize("query", history_pages())
def test_the_history_list_reads_no_whole_table_filtered_or_searched(month_of_history, db, rf, admin_user, query):
    """No Seq Scan on the history's partitions (but on a nearly empty one:
    today's first hours, the one made ahead, where reading its few pages is
    the plan; and for a date range, its day's partition, which the range
    prunes to), never one on more than that day's; counts bounded."""
    ran = statements_of(rf, admin_user, history_query(query), model=JobHistory)
    assert ran, "the history list ran no statement on shardq_job_history"
    store = WorkerStore()
    try:
        partitions = store.history_partitions()
    finally:
        store.close()
    small = small_partitions(partitions)
    for sql, params in ran:
        nodes = plan_nodes(sql, params)
        summary = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
        scanned = {
            n["Relation Name"]
            for n in nodes
            if n["Node Type"] == "Seq Scan" and (n.get("Relation Name") or "").startswith("shardq_job_history")
        } - small
        if query == "OLD_DAY":
            assert len(scanned) <= 1, (query, sql[:300], summary)
        else:
            assert not scanned, (query, sql[:300], summary)
        history_scans = [n for n in nodes if (n.get("Relation Name") or "").startswith("shardq_job_history")]
        if query in ("OLD_DAY", "RECENT_WEEK"):
            # Pruned: only the range's partitions are in the plan.
            assert len({n["Relation Name"] for n in history_scans}) < len(partitions), (query, summary)
        if sql.lstrip().upper().startswith("SELECT COUNT("):
            assert " LIMIT " in sql.upper(), f"an unbounded count: {sql[:300]}"


@pytest.mark.parametrize("name", ["admin_dashboard", "admin_timeseries"])
def test_the_dashboard_reads_the_finished_window_and_the_dead_letters_over_indexes(month_of_history, db, name):
    """The dashboard's two statements over a month of jobs (its dead letters
    in shardq_job, the rest in history): the window's finished jobs over
    shardq_job_archivable_idx, shardq_job_failed_idx and the history's
    partitions of the window, the dead letters per shard over a dead-letter
    index; never a Seq Scan on shardq_job (it read
    every dead letter: 17 s for 200,000 at load 27) nor on a large history
    partition."""
    from shardq.db.queries import QUERIES

    with connection.cursor() as cursor:
        cursor.execute("SET jit = off")  # as the admin runs it (shardq.admin.common.without_jit)
    nodes = plan_nodes(QUERIES[name], {"minutes": 60})
    summary = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "shardq_job"], summary
    store = WorkerStore()
    try:
        small = small_partitions(store.history_partitions())
    finally:
        store.close()
    history_seq = {
        n["Relation Name"]
        for n in nodes
        if n["Node Type"] == "Seq Scan" and (n.get("Relation Name") or "").startswith("shardq_job_history")
    }
    assert not history_seq - small, summary
    indexes = {n.get("Index Name") for n in nodes}
    assert {"shardq_job_archivable_idx", "shardq_job_failed_idx"} <= indexes, summary
    if name == "admin_dashboard":
        # Index-only from shardq_job_dead_shard_idx once vacuum has marked the
        # pages all-visible (as at ten million jobs); before, the planner may
        # prefer the dead-letter index by id: an index either way.
        assert {"shardq_job_dead_shard_idx", "shardq_job_dead_idx"} & indexes, summary
