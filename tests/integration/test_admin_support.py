"""What the admin stands on, without a browser: the ``sensitive=`` option of
``@shard_task`` (checked when the task is defined), the redaction of stored
arguments, and the shard map's READY counts walking the partial index."""

import json

import pytest
from django.contrib.admin.sites import site
from django.db import connection
from django.tasks import TaskContext
from django.tasks.exceptions import InvalidTask
from django.test import RequestFactory

from shardq import shard_task
from shardq.admin import ShardAdmin
from shardq.admin.redaction import REDACTED, redact_arguments, shard_key_is_sensitive
from shardq.db.queries import QUERIES
from shardq.models import Shard
from tests.helpers import indexes_built_after, sql


def login(user: str, password: str, *codes: str, remember: bool = False, **extra) -> None: ...


def with_context(context: TaskContext, token: str, note: str = "") -> None: ...


def by_key(email: str, body: str) -> None: ...


def test_sensitive_must_name_arguments_of_the_function():
    with pytest.raises(InvalidTask, match=r"sensitive names 'passwd', which is not an argument.*user, password"):
        shard_task(sensitive=("passwd",))(login)
    with pytest.raises(InvalidTask, match=r"a tuple of argument names, e\.g\. sensitive=\('password',\)"):
        shard_task(sensitive="password")(login)  # a bare string would mean its letters
    with pytest.raises(InvalidTask, match="'context', which is not an argument"):
        shard_task(takes_context=True, sensitive=("context",))(with_context)
    assert shard_task(sensitive=["password"])(login).sensitive == ("password",)
    assert shard_task(sensitive=True)(login).sensitive is True
    assert shard_task(login).sensitive == ()


def test_positional_values_are_redacted_through_the_signature():
    task = shard_task(sensitive=("password", "codes", "extra"))(login)
    args, kwargs = redact_arguments(task, ["ann", "s3cret", "123", "456"], {"remember": True, "otp": "9"})
    assert args == ["ann", REDACTED, REDACTED, REDACTED]  # *codes takes the extras
    assert kwargs == {"remember": True, "otp": REDACTED}  # **extra takes unknown names
    args, kwargs = redact_arguments(task, [], {"user": "ann", "password": "s3cret"})
    assert (args, kwargs) == ([], {"user": "ann", "password": REDACTED})


def test_the_context_parameter_is_not_stored_so_it_does_not_shift_positions():
    task = shard_task(takes_context=True, sensitive=("token",))(with_context)
    assert redact_arguments(task, ["t0ken", "n"], {}) == ([REDACTED, "n"], {})


def test_unknown_tasks_and_ill_fitting_rows_hide_everything():
    assert redact_arguments(None, [1, 2], {"a": 3}) == ([REDACTED, REDACTED], {"a": REDACTED})
    narrow = shard_task(sensitive=("body",))(by_key)
    # A third positional value has no parameter to name it: hidden, not guessed at.
    assert redact_arguments(narrow, ["a@b.c", "hi", "x"], {"zz": 1}) == (
        ["a@b.c", REDACTED, REDACTED],
        {"zz": REDACTED},
    )
    assert redact_arguments(narrow, {"not": "a list"}, {}) == (REDACTED, REDACTED)
    plain = shard_task(by_key)
    assert redact_arguments(plain, ["a@b.c", "hi"], {}) == (["a@b.c", "hi"], {})


def test_a_shard_key_taken_from_a_sensitive_argument_is_hidden_too():
    assert shard_key_is_sensitive(shard_task(key="email", sensitive=("email",))(by_key))
    assert not shard_key_is_sensitive(shard_task(key="email", sensitive=("body",))(by_key))
    assert shard_key_is_sensitive(shard_task(key=lambda a, k: 1, sensitive=("body",))(by_key))
    assert shard_key_is_sensitive(shard_task(sensitive=True)(by_key))
    assert shard_key_is_sensitive(None)


@pytest.fixture
def backlog(db):
    """60k READY and 60k SUCCESSFUL jobs over 64 shards, analyzed (rolled back
    with the test's transaction)."""
    with indexes_built_after("shardq_job"), connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 0,
                   clock_timestamp() - make_interval(secs => g % 600), g % 64, g, NULL, false,
                   CASE WHEN g % 2 = 0 THEN 'READY' ELSE 'SUCCESSFUL' END, 0, 0, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp()
            FROM generate_series(1, 120000) AS g
            """
        )
    sql("ANALYZE shardq_job")


def test_the_shard_map_counts_ready_jobs_through_the_partial_index(backlog):
    """The shard map's subqueries walk shardq_job_ready_idx and never scan shardq_job."""
    queryset = ShardAdmin(Shard, site).get_queryset(RequestFactory().get("/admin/shardq/shard/"))
    plan = json.loads(queryset.explain(format="json"))
    nodes = list(_nodes(plan[0]["Plan"]))
    summary = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "shardq_job"], summary
    job_indexes = {n["Index Name"] for n in nodes if n.get("Index Name", "").startswith("shardq_job")}
    assert job_indexes == {"shardq_job_ready_idx"}, summary
    depths = {s.shard: s.ready_depth for s in queryset}
    expected = {shard: 0 for shard in range(64)}
    for g in range(2, 120001, 2):
        expected[g % 64] += 1
    assert depths == expected


def test_the_dashboard_reads_ready_jobs_through_the_partial_index(backlog):
    """The finished jobs are one scan by design (no index on finished_at);
    the READY figures walk each shard's slice of shardq_job_ready_idx."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["admin_dashboard"], {"minutes": 15})
        document = cursor.fetchone()[0]
    plan = json.loads(document) if isinstance(document, str) else document
    nodes = list(_nodes(plan[0]["Plan"]))
    indexes = {n.get("Index Name") for n in nodes}
    assert "shardq_job_ready_idx" in indexes, [(n["Node Type"], n.get("Index Name")) for n in nodes]
    seq_scans = [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "shardq_job"]
    assert len(seq_scans) <= 1  # the finished jobs, once


def _nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.fixture
def hours_of_jobs(db):
    """200k jobs as three hours of work leave them (rolled back with the test's
    transaction): 75% finished over the last 3 hours, 20% READY (a backlog
    due over the last 40 minutes, some deferred), 5% RUNNING; analyzed."""
    with indexes_built_after("shardq_job"), connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash,
                shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, errors,
                worker_ids, enqueued_at, started_at, last_attempted_at, finished_at)
            SELECT 'tests.taskapp.tasks.noop', 'default', 'default', 0, t.due, g % 64, g, NULL, false,
                   t.status, 2, 1, 1, 1, '[]', '{}', '[]', '[]', t.due,
                   CASE WHEN t.status <> 'READY' THEN t.due + t.lat END,
                   CASE WHEN t.status <> 'READY' THEN t.due + t.lat END,
                   CASE WHEN t.status IN ('SUCCESSFUL', 'FAILED') THEN t.due + t.lat + interval '50 ms' END
            FROM generate_series(1, 200000) AS g
            CROSS JOIN LATERAL (SELECT
                CASE WHEN g % 20 < 15 THEN (CASE WHEN g % 37 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END)
                     WHEN g % 20 < 19 THEN 'READY' ELSE 'RUNNING' END AS status,
                CASE WHEN g % 20 < 15 THEN clock_timestamp() - make_interval(secs => (g * 7919 % 10800))
                     WHEN g % 20 < 19 THEN clock_timestamp() - make_interval(secs => (g * 7919 % 2400) - 300)
                     ELSE clock_timestamp() - make_interval(secs => (g % 600)) END AS due,
                make_interval(secs => (g % 1000) / 1000.0 * (1 + g % 7)) AS lat) AS t
            """
        )
    sql("ANALYZE shardq_job")


def test_the_dashboard_charts_read_waiting_jobs_through_their_indexes_and_scan_once(hours_of_jobs):
    """The hour's charts: READY jobs over shardq_job_due_idx, CLAIMED and
    RUNNING ones over shardq_job_inflight_idx, the finished ones in one scan
    (no index on finished_at, by design); a row a minute."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["admin_timeseries"], {"minutes": 60})
        document = cursor.fetchone()[0]
        cursor.execute(QUERIES["admin_timeseries"], {"minutes": 60})
        rows = cursor.fetchall()
    plan = json.loads(document) if isinstance(document, str) else document
    nodes = list(_nodes(plan[0]["Plan"]))
    summary = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    indexes = {n.get("Index Name") for n in nodes}
    assert {"shardq_job_due_idx", "shardq_job_inflight_idx"} <= indexes, summary
    seq_scans = [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "shardq_job"]
    assert len(seq_scans) <= 1, summary
    assert len(rows) == 60
    finished_in_hour = sum(r[1] + r[2] for r in rows)
    assert 40_000 <= finished_in_hour <= 60_000  # about a third of the 150k finished jobs
