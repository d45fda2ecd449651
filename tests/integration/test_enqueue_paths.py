"""The two fast enqueue paths of shardq.backend.

``task.enqueue()`` runs ``insert_job`` as a server-side prepared statement on
Django's own connection; ``shardq.enqueue_many`` reserves ids, COPYs the rows
and NOTIFYs each distinct shard once, in one atomic block. Both must keep the
transactional guarantees of a plain Django cursor.
"""

import gc
import weakref
from zoneinfo import ZoneInfo

import pytest
from django.db import DataError, IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import shardq
from shardq.db.enqueue import _statement_cursor
from tests.helpers import job_row
from tests.taskapp.tasks import add, echo, keyed, noop

from .conftest import job_count


class Rollback(Exception):
    pass


def prepared_inserts() -> int:
    """Protocol-level prepared statements of ``insert_job`` on Django's connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements "
            "WHERE NOT from_sql AND statement LIKE '%%INSERT INTO shardq_job%%'"
        )
        return cursor.fetchone()[0]


def take_next_job_id() -> int:
    """Store a row under the id the next enqueue will draw from the sequence, so
    that enqueue fails with a duplicate key (a real database error)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence('shardq_job', 'id'))")
        taken = cursor.fetchone()[0] + 1
        cursor.execute(
            "INSERT INTO shardq_job (id, task_path, backend, queue_name, priority, run_after, shard,"
            " key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args,"
            " kwargs, errors, worker_ids, enqueued_at)"
            " VALUES (%s, 'tests.taskapp.tasks.noop', 'default', 'default', 0, now(), 0, 0, NULL,"
            " false, 'SUCCESSFUL', 2, 0, 1, 1, '[]', '{}', '[]', '[]', now())",
            [taken],
        )
    return taken


def visible_to(conn, job_id) -> bool:
    return conn.execute("SELECT 1 FROM shardq_job WHERE id = %s", [int(job_id)]).fetchone() is not None


@pytest.fixture
def sent():
    """The TaskResults task_enqueued carried, in order."""
    results = []

    def receiver(sender, task_result, **kwargs):
        results.append(task_result)

    task_enqueued.connect(receiver)
    yield results
    task_enqueued.disconnect(receiver)


# -- one by one: the prepared statement ---------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_runs_insert_job_prepared_and_leaves_djangos_setting_alone():
    connection.close()  # a fresh connection: nothing prepared yet
    first = add.enqueue(1, 2)
    second = add.enqueue(3, 4)

    assert prepared_inserts() == 1  # prepared once, then reused
    assert connection.connection.prepare_threshold is None  # Django's queries stay unprepared
    for result, args in [(first, [1, 2]), (second, [3, 4])]:
        row = job_row(result.id)
        assert row["args"] == args and row["status"] == "READY"
        assert row["enqueued_at"] == result.enqueued_at and result.enqueued_at.tzinfo is not None


@pytest.mark.django_db(transaction=True)
def test_enqueue_keeps_one_cursor_per_connection_and_a_new_connection_gets_its_own():
    connection.close()
    first = add.enqueue(1, 2)
    raw = connection.connection
    kept = _statement_cursor(raw, connection.timezone)
    add.enqueue(3, 4)
    assert _statement_cursor(raw, connection.timezone) is kept  # reused, not rebuilt per statement

    connection.close()  # Django reconnects for the next statement
    second = add.enqueue(5, 6)
    assert connection.connection is not raw
    assert _statement_cursor(connection.connection, connection.timezone) is not kept
    for result, args in [(first, [1, 2]), (second, [5, 6])]:
        row = job_row(result.id)
        assert row["args"] == args and row["enqueued_at"] == result.enqueued_at
        # As a Django cursor loads timestamps: in the connection's time zone.
        assert result.enqueued_at.tzinfo is connection.timezone


@pytest.mark.django_db(transaction=True)
def test_a_closed_connection_and_its_kept_cursor_are_freed():
    connection.close()
    add.enqueue(1, 2)
    raw = weakref.ref(connection.connection)
    cursor = weakref.ref(_statement_cursor(connection.connection, connection.timezone))
    connection.close()
    gc.collect()
    assert raw() is None and cursor() is None


@pytest.mark.django_db
def test_the_kept_cursor_follows_the_connections_time_zone():
    connection.ensure_connection()
    raw = connection.connection
    paris = ZoneInfo("Europe/Paris")
    cursor = _statement_cursor(raw, paris)
    assert cursor.execute("SELECT statement_timestamp()").fetchone()[0].tzinfo is paris
    back = _statement_cursor(raw, connection.timezone)
    assert back is not cursor
    assert back.execute("SELECT statement_timestamp()").fetchone()[0].tzinfo is connection.timezone


@pytest.mark.django_db(transaction=True)
def test_prepared_statements_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(add.get_backend(), "prepared_statements", False)
    connection.close()

    result = add.enqueue(1, 2)

    assert job_row(result.id)["args"] == [1, 2]
    assert prepared_inserts() == 0


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_atomic_block_drops_prepared_enqueues_and_the_next_one_works(second_connection):
    with pytest.raises(Rollback), transaction.atomic():
        dropped = [add.enqueue(n, n) for n in range(3)]
        assert all(job_row(r.id) for r in dropped)  # visible inside the block
        raise Rollback

    assert not any(visible_to(second_connection, r.id) for r in dropped)
    kept = add.enqueue(9, 9)
    assert visible_to(second_connection, kept.id)


@pytest.mark.django_db(transaction=True)
def test_an_error_inside_atomic_rolls_back_and_the_connection_stays_usable(second_connection):
    with pytest.raises(IntegrityError), transaction.atomic():  # Django's exception class
        before = add.enqueue(1, 1)
        take_next_job_id()
        add.enqueue(2, 2)  # duplicate key

    assert not visible_to(second_connection, before.id)
    assert connection.errors_occurred is False  # an IntegrityError leaves the connection usable
    after = add.enqueue(3, 3)
    assert visible_to(second_connection, after.id)
    assert job_row(after.id)["args"] == [3, 3]


@pytest.mark.django_db(transaction=True)
def test_an_error_in_autocommit_leaves_the_connection_usable(second_connection):
    take_next_job_id()
    with pytest.raises(IntegrityError):
        add.enqueue(1, 1)

    after = add.enqueue(2, 2)
    assert visible_to(second_connection, after.id)


@pytest.mark.django_db(transaction=True)
def test_an_error_in_a_savepoint_drops_only_the_savepoint(second_connection):
    with transaction.atomic():
        kept = add.enqueue(1, 1)
        with pytest.raises(IntegrityError), transaction.atomic():
            take_next_job_id()
            add.enqueue(2, 2)
        also_kept = add.enqueue(3, 3)  # the outer transaction goes on
        assert not visible_to(second_connection, kept.id)

    assert visible_to(second_connection, kept.id)
    assert visible_to(second_connection, also_kept.id)


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_savepoint_drops_only_its_prepared_enqueues(second_connection):
    with transaction.atomic():
        kept = add.enqueue(1, 1)
        with pytest.raises(Rollback), transaction.atomic():
            dropped = add.enqueue(2, 2)
            raise Rollback
        later = add.enqueue(3, 3)

    assert visible_to(second_connection, kept.id)
    assert visible_to(second_connection, later.id)
    assert not visible_to(second_connection, dropped.id)


@pytest.mark.django_db(transaction=True)
def test_enqueue_refuses_to_run_in_a_broken_atomic_block():
    with transaction.atomic():
        with pytest.raises(Rollback), transaction.atomic(savepoint=False):
            raise Rollback  # marks the outer block as needing a rollback
        with pytest.raises(TransactionManagementError):
            add.enqueue(1, 2)


@pytest.mark.django_db
def test_query_capture_and_execute_wrappers_see_the_insert():
    # DEBUG-style capture and execute_wrapper() need Django's cursor: enqueue
    # uses it (unprepared) whenever either is active.
    with CaptureQueriesContext(connection) as queries:
        result = add.enqueue(1, 2)
    assert len(queries) == 1 and "INSERT INTO shardq_job" in queries[0]["sql"]

    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        other = add.enqueue(3, 4)
    assert len(seen) == 1 and "INSERT INTO shardq_job" in seen[0]
    assert job_row(result.id)["args"] == [1, 2] and job_row(other.id)["args"] == [3, 4]


@pytest.mark.django_db
def test_enqueue_sends_task_enqueued_with_the_result(sent):
    result = keyed.enqueue(user_id=7)

    assert sent == [result]
    assert result.kwargs == {"user_id": 7} and result.args == []


# -- bulk: reserved ids, COPY, one NOTIFY per shard ---------------------------------


@pytest.mark.django_db
def test_the_copy_stores_exactly_the_rows_with_their_ids_shards_and_times(sent):
    awkward = ["tab\there", "new\nline", "back\\slash", "\\N", "cr\rx", "quote\"'", "ünïcode ☃", ""]
    calls = [((), {"user_id": key, "note": f"{key}|\\|\t|\n"}) for key in awkward]
    calls += [((n,), {}) for n in range(200)]
    before = job_count()

    results = shardq.enqueue_many(keyed, calls)

    assert job_count() == before + len(calls)
    ids = [int(r.id) for r in results]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    backend = keyed.get_backend()
    enqueued_at = results[0].enqueued_at
    assert enqueued_at.tzinfo is not None
    for result, (args, kwargs) in zip(results, calls, strict=True):
        row = job_row(result.id)
        expected = backend.rows.job_row(keyed, args, kwargs)
        assert (row["shard"], row["key_hash"], row["shard_key"]) == (
            expected["key_hash"] & 63,
            expected["key_hash"],
            expected["shard_key"],
        )
        assert row["args"] == list(args) == result.args
        assert row["kwargs"] == kwargs == result.kwargs
        assert row["enqueued_at"] == row["run_after"] == result.enqueued_at == enqueued_at
        assert (row["status"], row["status_rank"], row["fence"], row["attempts"]) == ("READY", 0, 0, 0)
        assert (row["task_path"], row["backend"], row["queue_name"], row["priority"]) == (
            keyed.module_path,
            "default",
            "default",
            10,
        )
        assert (row["ordered"], row["max_attempts"], row["errors"], row["worker_ids"]) == (
            keyed.ordered,
            keyed.max_attempts,
            [],
            [],
        )
        assert row["return_value"] is None and row["started_at"] is None
    assert sent == results  # the signal for every job, in call order


@pytest.mark.django_db
def test_a_deferred_bulk_enqueue_stores_the_tasks_run_after():
    when = timezone.now() + timezone.timedelta(hours=1)

    results = shardq.enqueue_many(add.using(run_after=when, priority=-5), [((n, n), {}) for n in range(3)])

    for result in results:
        row = job_row(result.id)
        assert (row["run_after"], row["priority"], row["queue_name"]) == (when, -5, "reports")
        assert row["enqueued_at"] == result.enqueued_at < when


@pytest.mark.django_db(transaction=True)
def test_one_notify_per_distinct_shard_and_only_after_commit(second_connection):
    second_connection.execute("LISTEN shardq")
    calls = [((), {"user_id": user_id % 5}) for user_id in range(100)]
    with transaction.atomic():
        results = shardq.enqueue_many(keyed, calls)
        before_commit = list(second_connection.notifies(timeout=0.2))

    after_commit = list(second_connection.notifies(timeout=0.5))

    shards = {job_row(r.id)["shard"] for r in results}
    assert before_commit == []
    # shard:priority
    assert sorted(n.payload for n in after_commit) == sorted(f"{s}:{keyed.priority}" for s in shards)


@pytest.mark.django_db(transaction=True)
def test_no_notify_when_notify_is_off(second_connection, shardq_settings):
    second_connection.execute("LISTEN shardq")
    with shardq_settings(NOTIFY=False):
        results = shardq.enqueue_many(keyed, [((), {"user_id": n}) for n in range(10)])

    assert all(visible_to(second_connection, r.id) for r in results)  # committed in autocommit
    assert list(second_connection.notifies(timeout=0.3)) == []


@pytest.mark.django_db
def test_an_invalid_call_stores_nothing_and_runs_no_statement(sent):
    before = job_count()
    calls = [((n, n), {}) for n in range(100)] + [((1, {1, 2}), {})]

    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTask):
        shardq.enqueue_many(add, calls)

    assert len(queries) == 0
    assert job_count() == before
    assert sent == []


@pytest.fixture
def corrupt_last_row(monkeypatch):
    """Every COPY's row with args [666] gets invalid JSON: the server rejects
    the COPY after taking in the rows before it."""
    import shardq.db.enqueue

    real = shardq.db.enqueue.copy_json
    monkeypatch.setattr(shardq.db.enqueue, "copy_json", lambda text: "[666" if text == "[666]" else real(text))


@pytest.mark.django_db(transaction=True)
def test_a_failed_copy_stores_nothing_and_leaves_the_callers_transaction_usable(
    second_connection, sent, corrupt_last_row
):
    before = job_count()
    bad = [((n, n), {}) for n in range(1500)] + [((666,), {})]  # the bad row comes after a first chunk

    with pytest.raises(DataError):
        shardq.enqueue_many(echo, bad)  # autocommit: its own transaction
    assert job_count() == before

    with transaction.atomic():
        kept = add.enqueue(1, 1)
        with pytest.raises(DataError):
            shardq.enqueue_many(echo, bad)  # a savepoint inside the caller's transaction
        also_kept = shardq.enqueue_many(add, [((2, 2), {})])[0]

    assert visible_to(second_connection, kept.id) and visible_to(second_connection, also_kept.id)
    assert job_count() == before + 2
    assert sent == [kept, also_kept]


@pytest.mark.django_db(transaction=True)
def test_an_error_while_building_results_aborts_the_copy(monkeypatch, sent):
    backend = noop.get_backend()
    real = backend._new_result

    def fail_at_30(task, job_id, *rest):
        if len(built) == 30:
            raise RuntimeError("boom")
        built.append(job_id)
        return real(task, job_id, *rest)

    built = []
    monkeypatch.setattr(backend, "_new_result", fail_at_30)
    before = job_count()

    with pytest.raises(RuntimeError, match="boom"):
        shardq.enqueue_many(echo, [((n,), {}) for n in range(100)])

    assert job_count() == before and sent == []
    monkeypatch.undo()
    assert len(shardq.enqueue_many(echo, [((1,), {})])) == 1  # the connection works


@pytest.mark.django_db
def test_bulk_results_equal_what_the_taskresult_constructor_builds():
    from django.tasks import TaskResult, TaskResultStatus

    result = shardq.enqueue_many(add, [((1, 2), {}), ((), {"a": (1, [2]), "b": 3})])[1]

    assert result == TaskResult(
        task=add,
        id=result.id,
        status=TaskResultStatus.READY,
        enqueued_at=result.enqueued_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=[],
        kwargs={"a": (1, [2]), "b": 3},
        backend="default",
        errors=[],
        worker_ids=[],
    )
    assert result.kwargs == {"a": [1, [2]], "b": 3}  # normalized as Django's __post_init__ does
    assert result.args == [] and result.errors == [] and result.worker_ids == []


@pytest.mark.django_db
def test_a_bulk_enqueue_runs_a_fixed_number_of_statements():
    with CaptureQueriesContext(connection) as few:
        shardq.enqueue_many(echo, [((n,), {}) for n in range(10)])
    with CaptureQueriesContext(connection) as many:
        shardq.enqueue_many(echo, [((n,), {}) for n in range(2000)])

    assert len(few) == len(many) <= 5  # savepoint, ids, COPY, NOTIFY, release
    assert any(q["sql"].startswith("COPY shardq_job") for q in many)
