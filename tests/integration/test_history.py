"""History leaves the hot table (issue 27 §1; docs/architecture.md, "History"):
the archiver's move, its partitions, and every reader of a result across it."""

import dataclasses
import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.tasks import TaskResultStatus, default_task_backend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardq
from shardq.conf import get_config
from shardq.db import operations
from shardq.db.store import WorkerStore, sync_history_columns
from shardq.models import Job, JobHistory
from shardq.worker.archiver import Archiver
from shardq.worker.stats import Stats
from tests.helpers import job_factory, scalar, sql, stepped_worker, wait_until
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def archiver():
    """An archiver stepped by the test (``pass_once``), with no grace: a job
    moves at the first pass after it finished."""
    # Partitions outlive a test's flush: each test starts with none.
    for (name,) in sql("SELECT name FROM (" + _query("history_partitions") + ") AS p"):
        sql(f'DROP TABLE "{name}"')
    history = dataclasses.replace(get_config().history, grace_seconds=0.0)
    service = Archiver(WorkerStore(application_name="shardq-archiver-test"), history, Stats())
    yield service
    service.store.close()


def where(job_id: int) -> str:
    """'hot', 'history', or 'gone' (never both: one statement moves a job)."""
    hot = scalar("SELECT count(*) FROM shardq_job WHERE id = %s", [job_id])
    old = scalar("SELECT count(*) FROM shardq_job_history WHERE id = %s", [job_id])
    assert hot + old <= 1, f"job {job_id} is in both tables"
    return "hot" if hot else "history" if old else "gone"


def finish(ids: list[int], status: str, *, seconds_ago: float = 5.0, error: str | None = None, value=None) -> None:
    """Mark jobs finished as the completer does: status, finished_at, an error
    (exception class path) appended, a return value."""
    errors = [] if error is None else [{"exception_class_path": error, "traceback": f"{error}: x\n"}]
    sql(
        "UPDATE shardq_job SET status = %s, status_rank = status_rank + 2, attempts = 1, "
        "started_at = clock_timestamp() - make_interval(secs => %s + 1), "
        "last_attempted_at = clock_timestamp() - make_interval(secs => %s + 1), "
        "finished_at = clock_timestamp() - make_interval(secs => %s), errors = %s::jsonb, "
        "return_value = %s::jsonb, worker_ids = '[\"w\"]' WHERE id = ANY(%s)",
        [status, seconds_ago, seconds_ago, seconds_ago, json.dumps(errors), json.dumps(value), ids],
    )


# -- the two tables ---------------------------------------------------------------


def test_history_has_every_column_of_shardq_job_at_the_same_place_and_type():
    drift = sql(
        "SELECT name, hot_type, history_type, hot_place, history_place FROM ("
        + _query("history_column_drift")
        + ") AS d"
    )
    assert drift == [], f"shardq_job and shardq_job_history differ: {drift}"
    # The admin's model is derived from Job's: the same fields, by name.
    assert [f.name for f in JobHistory._meta.local_fields] == [f.name for f in Job._meta.local_fields]


def _query(name: str) -> str:
    from shardq.db.queries import QUERIES

    return QUERIES[name]


def test_a_column_added_to_shardq_job_alone_is_added_to_history_after_migrate():
    sql("ALTER TABLE shardq_job ADD COLUMN history_probe text[]")
    try:
        drift = [row[0] for row in sql(_query("history_column_drift"))]
        assert drift == ["history_probe"]
        sync_history_columns()  # what post_migrate runs
        assert sql(_query("history_column_drift")) == []
    finally:
        sql("ALTER TABLE shardq_job DROP COLUMN history_probe")
        sql("ALTER TABLE shardq_job_history DROP COLUMN IF EXISTS history_probe")


# -- the archiver -------------------------------------------------------------------


def test_the_archiver_moves_done_and_cancelled_jobs_and_leaves_the_rest(archiver):
    done = job_factory(3)
    finish(done, "SUCCESSFUL", value=7)
    cancelled = job_factory(2)
    finish(cancelled, "FAILED", error="shardq.exceptions.Cancelled")
    dead = job_factory(2)
    finish(dead, "FAILED", error="builtins.ValueError")
    ready, running = job_factory(2), job_factory(1, status="RUNNING")
    waiting, suspended = job_factory(1, status="WAITING"), job_factory(1, status="SUSPENDED")
    assert archiver.pass_once() == 5
    assert archiver.holder
    assert {where(i) for i in done + cancelled} == {"history"}
    # Dead letters stay: the operator's work items (retry, discard).
    assert {where(i) for i in dead + ready + running + waiting + suspended} == {"hot"}
    assert archiver.stats.snapshot()["archived"] == 5
    assert archiver.pass_once() == 0


def test_a_job_finished_within_the_grace_stays_in_the_hot_table(archiver):
    fresh = job_factory(2)
    finish(fresh, "SUCCESSFUL", seconds_ago=0.0)
    archiver.history = dataclasses.replace(archiver.history, grace_seconds=60.0)
    assert archiver.pass_once() == 0
    assert {where(i) for i in fresh} == {"hot"}


def test_the_archiver_moves_in_batches_and_a_pass_goes_on_past_one_batch(archiver):
    archiver.history = dataclasses.replace(archiver.history, batch=3)
    ids = job_factory(10)
    finish(ids, "SUCCESSFUL")
    assert archiver.pass_once() == 10
    assert scalar("SELECT count(*) FROM shardq_job_history WHERE id = ANY(%s)", [ids]) == 10


def test_one_archiver_works_at_a_time_and_the_next_takes_over_when_it_goes(archiver):
    other = Archiver(WorkerStore(application_name="shardq-archiver-other"), archiver.history, Stats())
    try:
        ids = job_factory(2)
        finish(ids, "SUCCESSFUL")
        assert archiver.pass_once() == 2
        more = job_factory(2)
        finish(more, "SUCCESSFUL")
        assert other.pass_once() == 0 and not other.holder
        archiver.store.close()  # its session ends: the lock goes with it (once the server has ended it)
        wait_until(lambda: other.pass_once() == 2, timeout=10, message="no takeover")
        assert other.holder
    finally:
        other.store.close()


def test_a_parent_whose_children_wait_stays_until_they_are_moved_on(archiver):
    [parent] = job_factory(1)
    [child] = job_factory(1, status="WAITING")
    sql(
        "INSERT INTO shardq_edge (parent, child, name, run_on_failure, resolved) VALUES (%s, %s, 'p', false, false)",
        [parent, child],
    )
    finish([parent], "SUCCESSFUL")
    assert archiver.pass_once() == 0 and where(parent) == "hot"
    sql("UPDATE shardq_job SET status = 'READY' WHERE id = %s", [child])
    assert archiver.pass_once() == 1 and where(parent) == "history"


def test_partitions_are_made_ahead_and_dropped_whole_past_the_retention(archiver):
    width = 3600
    archiver.history = dataclasses.replace(archiver.history, partition_seconds=width, keep_seconds=2 * width)
    archiver.maintain()
    partitions = archiver.store.history_partitions()
    assert len(partitions) >= 4  # from the retention's start to two partitions ahead
    assert all((p["high"] - p["low"]).total_seconds() == width for p in partitions)
    ids = job_factory(4)
    finish(ids, "SUCCESSFUL", seconds_ago=30)
    assert archiver.pass_once() == 4
    # Time passes: the partitions holding the jobs fall past a shorter retention.
    archiver.history = dataclasses.replace(archiver.history, keep_seconds=0.0)
    _created, dropped = archiver.store.maintain_history(0.0, width, ahead_seconds=2 * width)
    names = {p["name"] for p in partitions}
    assert dropped and set(dropped) <= names
    remaining = {p["name"] for p in archiver.store.history_partitions()}
    assert not set(dropped) & remaining
    # Jobs of the current partition survive; the dropped ones were older.
    assert all(where(i) in ("history", "gone") for i in ids)


def test_a_job_finished_before_the_oldest_partition_is_deleted_not_moved(archiver):
    archiver.maintain()
    [old] = job_factory(1)
    finish([old], "SUCCESSFUL", seconds_ago=archiver.history.keep_seconds + 3 * 86400)
    assert archiver.pass_once() == 1
    assert where(old) == "gone"
    assert archiver.stats.snapshot()["expired_unarchived"] == 1


# -- readers across the move ----------------------------------------------------------


STATES = ["READY", "CLAIMED", "RUNNING", "WAITING", "SUSPENDED", "SUCCESSFUL", "DEAD", "CANCELLED"]


def test_get_result_is_the_same_before_and_after_the_archiver_for_every_state(archiver):
    # JSON that jsonb stores (no NUL, no lone surrogate).
    text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=8,
    )

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(STATES), json_values, st.lists(json_values, max_size=3), st.booleans())
    def example(state, value, args, archive):
        [job_id] = job_factory(1, task_path="tests.taskapp.tasks.echo", args=args)
        if state in ("SUCCESSFUL", "DEAD", "CANCELLED"):
            error = {"DEAD": "builtins.ValueError", "CANCELLED": "shardq.exceptions.Cancelled"}.get(state)
            finish([job_id], "SUCCESSFUL" if state == "SUCCESSFUL" else "FAILED", error=error, value=value)
        else:
            sql("UPDATE shardq_job SET status = %s WHERE id = %s", [state, job_id])
        before = default_task_backend.get_result(str(job_id))
        if archive:
            archiver.pass_once()
        after = default_task_backend.get_result(str(job_id))
        assert where(job_id) == ("history" if archive and state in ("SUCCESSFUL", "CANCELLED") else "hot")
        assert after == before
        assert after.status == before.status
        if state == "SUCCESSFUL":
            assert after.return_value == value

    example()


def test_a_workflow_child_reads_its_archived_parents_results(archiver):
    first = tasks.add.enqueue(2, 3)
    finish([int(first.id)], "SUCCESSFUL", value=5)
    archiver.pass_once()
    assert where(int(first.id)) == "history"
    # A new step after a job that moved: the parent comes back for the resolver.
    second = tasks.echo.using(after=[first]).enqueue()
    assert where(int(first.id)) == "hot"
    assert scalar("SELECT children_pending FROM shardq_job WHERE id = %s", [int(first.id)])
    with stepped_worker() as stepped:
        # The resolver moves the child on from its restored parent.
        assert stepped.worker.resolver.resolve() == 1
    assert scalar("SELECT status FROM shardq_job WHERE id = %s", [int(second.id)]) == "READY"
    # The parent's result, read from history after it moves again.
    finish([int(second.id)], "SUCCESSFUL", value=None)
    archiver.pass_once()
    rows = {name: result for name, result in _parent_results(int(second.id)).items()}
    assert [r.return_value for r in rows.values()] == [5]


def _parent_results(job_id: int):
    from shardq.db import operations

    rows = operations.run("parent_results", {"id": job_id}, named=True)
    return {row["step_name"]: default_task_backend.result_from_row(row) for row in rows}


def test_a_unique_key_stays_taken_while_its_job_is_in_history(archiver):
    first = tasks.unique_report.enqueue(41)
    finish([int(first.id)], "SUCCESSFUL", value=1)
    archiver.pass_once()
    assert where(int(first.id)) == "history"
    again = tasks.unique_report.enqueue(41)
    assert again.id == first.id
    assert default_task_backend.get_result(again.id).status == TaskResultStatus.SUCCESSFUL
    # The key is freed only for a holder that exists nowhere: one in history holds it.
    freed = operations.run(
        "release_unique_key", {"unique_key": _unique_key(int(first.id)), "job_id": int(first.id)}, fetch="none"
    )
    assert freed == 0
    assert scalar("SELECT count(*) FROM shardq_unique WHERE job_id = %s", [int(first.id)]) == 1


def _unique_key(job_id: int) -> str:
    return scalar("SELECT key FROM shardq_unique WHERE job_id = %s", [job_id])


def test_a_zombies_outcome_for_a_moved_job_writes_nothing_and_is_counted_as_refused(archiver):
    [job_id] = job_factory(1, task_path="tests.taskapp.tasks.noop")
    with stepped_worker() as stepped:
        [claimed] = stepped.claim(1)
        assert claimed.id == job_id
        stepped.run(1)  # the attempt ran; its outcome waits for the completer
        # Meanwhile the job is cancelled, and archived once past the grace.
        assert shardq.cancel(str(job_id)) == [str(job_id)]
        sql("UPDATE shardq_job SET finished_at = clock_timestamp() - interval '5 seconds' WHERE id = %s", [job_id])
        assert archiver.pass_once() == 1 and where(job_id) == "history"
        kept = scalar("SELECT row_to_json(h)::text FROM shardq_job_history AS h WHERE id = %s", [job_id])
        assert stepped.write() == set()  # the stale write lands nowhere
        # Counted as every lost-ownership write is, never retried as an error.
        assert stepped.worker.stats.snapshot()["fence_rejections"] == 1
        assert scalar("SELECT row_to_json(h)::text FROM shardq_job_history AS h WHERE id = %s", [job_id]) == kept
        assert where(job_id) == "history"


def test_status_reports_the_history_estimate(archiver):
    ids = job_factory(3)
    finish(ids, "SUCCESSFUL")
    archiver.pass_once()
    sql("ANALYZE shardq_job_history")
    out = io.StringIO()
    call_command("shardq_status", "--json", stdout=out)
    history = json.loads(out.getvalue())["history"]
    assert history["partitions"] >= 1 and history["estimated_jobs"] >= 3
    out = io.StringIO()
    call_command("shardq_status", stdout=out)
    assert "history: about" in out.getvalue()


def test_the_metrics_export_the_history_estimate_and_a_hand_made_unbounded_partition_breaks_nothing(archiver):
    import prometheus_client

    from shardq.worker.metrics import Metrics

    registry = prometheus_client.CollectorRegistry()
    metrics = Metrics(registry, multiprocess=False)
    ids = job_factory(3)
    finish(ids, "SUCCESSFUL")
    archiver.pass_once()
    sql("ANALYZE shardq_job_history")
    metrics.history_sample(archiver.store.history_gauges())
    partitions = registry.get_sample_value("shardq_history_partitions")
    assert partitions >= 1
    assert registry.get_sample_value("shardq_history_rows_estimated") >= 3
    # History reaches back over what it keeps, to the start of the oldest partition.
    reach = archiver.history.keep_seconds + archiver.history.partition_seconds + 60
    assert 0 < registry.get_sample_value("shardq_history_oldest_seconds") <= reach
    # An operator's partition made by hand from MINVALUE: counted, its start has no age.
    sql(
        "CREATE TABLE shardq_job_history_by_hand PARTITION OF shardq_job_history FOR VALUES FROM (MINVALUE) TO ('2000-01-01')"
    )
    metrics.history_sample(archiver.store.history_gauges())
    assert registry.get_sample_value("shardq_history_partitions") == partitions + 1
    assert registry.get_sample_value("shardq_history_oldest_seconds") <= reach
    # Not the metrics lock's holder: zero, nothing stale.
    metrics.history_sample(None)
    assert registry.get_sample_value("shardq_history_rows_estimated") == 0
    assert registry.get_sample_value("shardq_history_partitions") == 0


def test_prune_drops_history_partitions_past_older_than_with_no_delete(archiver):
    width = 3600
    # Six hours kept, not HISTORY_DAYS' 7 days: hourly partitions over a
    # week are 170 tables with 8 indexes each, made and dropped in the test
    # (35-45 s of it under load); the jobs finished 3 h ago are in one of six.
    archiver.history = dataclasses.replace(archiver.history, partition_seconds=width, keep_seconds=6 * width)
    archiver.maintain()
    ids = job_factory(2)
    finish(ids, "SUCCESSFUL", seconds_ago=3 * 3600)
    assert archiver.pass_once() == 2
    out = io.StringIO()
    call_command("shardq_prune", "--older-than", "1h", "--no-progress", stdout=out)
    assert "dropped" in out.getvalue() and "history partitions" in out.getvalue()
    assert {where(i) for i in ids} == {"gone"}


# -- the admin's "Job history" ------------------------------------------------------


def test_the_admin_lists_and_shows_archived_jobs_read_only_without_counting_them(archiver, admin_client):
    ids = job_factory(3, task_path="tests.taskapp.tasks.add", args=[2, 3])
    finish(ids, "SUCCESSFUL", value=5)
    cancelled = job_factory(1)
    finish(cancelled, "FAILED", error="shardq.exceptions.Cancelled")
    archiver.pass_once()
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/shardq/jobhistory/")
    assert page.status_code == 200, page.content.decode()[-3000:]
    text = page.content.decode()
    assert all(f">{i}<" in text for i in ids + cancelled), text[:2000]
    # Never a count(*) over the whole history: the estimate, or a count
    # bounded by a LIMIT.
    counts = [
        q["sql"]
        for q in queries.captured_queries
        if "COUNT(" in q["sql"].upper() and '"shardq_job_history"' in q["sql"]
    ]
    assert all("LIMIT" in q.upper() for q in counts), counts
    filtered = admin_client.get("/admin/shardq/jobhistory/", {"status__exact": "FAILED"}).content.decode()
    assert f">{cancelled[0]}<" in filtered and f">{ids[0]}<" not in filtered
    by_task = admin_client.get("/admin/shardq/jobhistory/", {"q": "tests.taskapp.tasks.add"}).content.decode()
    assert all(f">{i}<" in by_task for i in ids) and f">{cancelled[0]}<" not in by_task
    detail = admin_client.get(f"/admin/shardq/jobhistory/{ids[0]}/change/")
    assert detail.status_code == 200
    assert "SUCCESSFUL" in detail.content.decode()
    assert admin_client.get("/admin/shardq/jobhistory/999999999/change/").status_code in (302, 404)
    # Read-only: no add, no delete, no action.
    assert admin_client.get("/admin/shardq/jobhistory/add/").status_code == 403
    assert admin_client.post(f"/admin/shardq/jobhistory/{ids[0]}/delete/").status_code == 403


def test_the_history_list_uses_its_indexes_at_scale(archiver):
    """The list's statements at a page of a large history: each walks an index
    (EXPLAIN; the history's partitions hold 50,000 rows here)."""
    archiver.maintain()
    sql(
        "INSERT INTO shardq_job_history (id, task_path, backend, queue_name, priority, run_after, shard, key_hash, "
        "ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, "
        "enqueued_at, finished_at, worker_losses, children_pending, waiting_on, key_limited) "
        "SELECT g, 'tests.taskapp.tasks.t' || (g % 20), 'default', 'q' || (g % 5), 0, clock_timestamp(), 0, 0, "
        "false, CASE WHEN g % 50 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END, 2, 0, 1, 1, '[]', '{}', '[]', '[]', "
        "clock_timestamp(), clock_timestamp() - make_interval(secs => g % 3600), 0, false, 0, false "
        "FROM generate_series(1000000000, 1000050000) AS g"
    )
    sql("ANALYZE shardq_job_history")
    from shardq.admin.history import JobHistoryAdmin
    from shardq.models import JobHistory as Model

    for filters in ({}, {"status": "FAILED"}, {"queue_name": "q3"}, {"task_path": "tests.taskapp.tasks.t7"}):
        statement, params = Model.objects.filter(**filters).order_by("-id")[:100].query.sql_with_params()
        plan = "\n".join(row[0] for row in sql("EXPLAIN " + statement, params))
        assert "Seq Scan" not in plan, (filters, plan)
    assert JobHistoryAdmin.paginator is not None


@pytest.mark.parametrize(
    "key, value",
    [("HISTORY_DAYS", -1), ("HISTORY_GRACE", "soon"), ("HISTORY_PARTITION", 10), ("HISTORY_BATCH", 0.5)],
)
def test_a_bad_history_setting_is_check_e014_naming_the_key(settings, key, value):
    from django.tasks import default_task_backend as backend

    from shardq.checks import backend_checks

    settings.SHARDQ = {**settings.SHARDQ, key: value}
    errors = [e for e in backend_checks(backend) if e.id == "shardq.E014"]
    assert len(errors) == 1 and key in errors[0].msg, errors


def test_the_archiver_walks_its_partial_index_not_the_table(archiver):
    """archive_jobs repeats shardq_job_archivable_idx's predicate (the block
    ``archivable``): EXPLAIN shows the walk, with dead letters and live jobs
    beside it that it must not read."""
    archiver.maintain()
    dead = job_factory(300)
    finish(dead, "FAILED", error="builtins.ValueError")
    job_factory(3000)
    done = job_factory(50)
    finish(done, "SUCCESSFUL")
    sql("ANALYZE shardq_job")
    params = {"grace": 0.0, "batch": 5000, "floor": archiver.floor, "ceiling": archiver.ceiling}
    from shardq.db.queries import QUERIES

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + QUERIES["archive_jobs"], params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "shardq_job_archivable_idx" in plan, plan
    assert "Seq Scan on shardq_job " not in plan, plan
