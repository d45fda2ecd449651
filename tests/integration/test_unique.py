"""Unique jobs: while a job with the same unique key was enqueued less than
``unique_for`` ago, enqueue stores nothing and returns that job's result.

Real PostgreSQL. Tests about several connections or about what happens at
COMMIT are ``transaction=True``; the others run inside the test's own
transaction, where on_commit never fires and so the per-process LRU of
unique keys is never filled (every duplicate there is answered by the table).
"""

import math
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import shardq
from shardq import shard_task
from shardq.backend import ShardqBackend
from shardq.enqueue.unique import UNIQUE_CACHE_MARGIN_SECONDS
from shardq.tasks import compute_unique_key
from tests.helpers import job_row, wait_until
from tests.taskapp.tasks import (
    unique_brief,
    unique_fleeting,
    unique_invoice,
    unique_per_account,
    unique_per_order,
    unique_report,
)

from .conftest import execute, reset_task_backends


class Rollback(Exception):
    pass


def two_arguments(account_id: int, note: str) -> None:
    """A module-level function the definition tests decorate on the spot."""


def takes_context(context, account_id: int) -> None:
    """A module-level function with a context argument."""


@pytest.fixture(autouse=True)
def fresh_backends():
    # Each test starts with an empty LRU: a transactional test's flush empties
    # the tables, not the cache of the previous test's backend.
    reset_task_backends()
    yield
    reset_task_backends()


def jobs_of(task) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shardq_job WHERE task_path = %s", [task.module_path])
        return cursor.fetchone()[0]


def unique_row(key: str):
    """(job_id, seconds left by the database's clock) of a unique key, or None."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT job_id, extract(epoch FROM expires_at - clock_timestamp())::float8"
            " FROM shardq_unique WHERE key = %s",
            [key],
        )
        return cursor.fetchone()


def cached(task, key: str):
    """The backend's LRU entry of a unique key (deadline, result), or None."""
    lru = task.get_backend().unique.cache
    return None if lru is None else lru.peek(key)


def lock_waiters(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()[0]


def in_thread(function):
    """Run ``function`` in a thread with its own Django connection (another
    enqueuer); returns (thread, outcome dict)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except Exception as exc:  # handed to the test, which re-raises it
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def joined(thread, outcome):
    thread.join(30)
    assert not thread.is_alive(), "the other enqueuer never finished"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# -- definition time -------------------------------------------------------------


@pytest.mark.parametrize(
    "unique_for",
    [0, -1, 0.0, timedelta(0), timedelta(seconds=-5), math.nan, math.inf, 10**12],
    ids=["zero", "negative", "zero-float", "zero-timedelta", "negative-timedelta", "nan", "inf", "huge"],
)
def test_a_unique_for_that_is_not_a_positive_duration_fails_at_definition(unique_for):
    with pytest.raises(
        InvalidTask, match=r"two_arguments: unique_for must be a positive duration of at most 100 years"
    ):
        shard_task(unique_for=unique_for)(two_arguments)


@pytest.mark.parametrize("unique_for", [True, "60", [60]])
def test_a_unique_for_that_is_not_seconds_or_a_timedelta_fails_at_definition(unique_for):
    with pytest.raises(InvalidTask, match=r"unique_for must be a number of seconds or a datetime\.timedelta"):
        shard_task(unique_for=unique_for)(two_arguments)


def test_a_unique_key_that_names_no_argument_fails_at_definition():
    expected = (
        r"two_arguments: unique_key='user_id' is not an argument of the function "
        r"\(its arguments: account_id, note\). Name one of them, or pass a callable unique_key="
    )
    with pytest.raises(InvalidTask, match=expected):
        shard_task(unique_for=60, unique_key="user_id")(two_arguments)


def test_the_context_argument_cannot_be_the_unique_key():
    with pytest.raises(InvalidTask, match="unique_key='context' is not an argument"):
        shard_task(unique_for=60, unique_key="context", takes_context=True)(takes_context)


@pytest.mark.parametrize("unique_key", [42, ("account_id",), b"account_id"])
def test_a_unique_key_that_is_neither_a_name_nor_a_callable_fails_at_definition(unique_key):
    with pytest.raises(
        InvalidTask, match=r"unique_key must be None \(every argument\), the name of an argument, or a callable"
    ):
        shard_task(unique_for=60, unique_key=unique_key)(two_arguments)


def test_a_unique_key_without_unique_for_fails_at_definition():
    with pytest.raises(InvalidTask, match="unique_key='account_id' has no effect without unique_for"):
        shard_task(unique_key="account_id")(two_arguments)


def test_unique_for_takes_seconds_or_a_timedelta_and_using_keeps_it():
    assert shard_task(unique_for=90)(two_arguments).unique_for_seconds == 90.0
    assert shard_task(unique_for=0.25)(two_arguments).unique_for_seconds == 0.25
    task = shard_task(unique_for=timedelta(minutes=5), unique_key="account_id")(two_arguments)
    assert task.unique_for_seconds == 300.0

    changed = task.using(priority=5, queue_name="emails")
    assert (changed.unique_for, changed.unique_key, changed.priority) == (timedelta(minutes=5), "account_id", 5)
    assert shard_task(two_arguments).unique_for_seconds is None


def test_the_unique_key_is_prefixed_with_the_task_path_and_names_positional_arguments():
    by_position = compute_unique_key(unique_report, (7,), {})
    by_name = compute_unique_key(unique_report, (), {"account_id": 7})

    assert by_position == by_name == 'tests.taskapp.tasks.unique_report:{"account_id":7}'
    assert compute_unique_key(unique_report, (7, "weekly"), {}) == (
        'tests.taskapp.tasks.unique_report:{"account_id":7,"kind":"weekly"}'
    )
    assert compute_unique_key(unique_per_account, (7,), {"note": "x"}) == "tests.taskapp.tasks.unique_per_account:7"
    assert compute_unique_key(unique_per_order, ({"id": 3},), {}) == "tests.taskapp.tasks.unique_per_order:order-3"


def test_a_long_unique_key_is_stored_as_a_digest():
    key = compute_unique_key(unique_report, (7, "x" * 5000), {})

    assert key.startswith("tests.taskapp.tasks.unique_report#sha256:") and len(key) < 200
    assert key == compute_unique_key(unique_report, (), {"kind": "x" * 5000, "account_id": 7})


# -- the table decides -------------------------------------------------------------


@pytest.mark.django_db
def test_a_duplicate_within_the_ttl_returns_the_same_job_and_stores_one_row():
    first = unique_report.enqueue(7)
    again = unique_report.enqueue(account_id=7)

    assert again.id == first.id
    assert jobs_of(unique_report) == 1
    key = compute_unique_key(unique_report, (7,), {})
    job_id, seconds_left = unique_row(key)
    assert str(job_id) == first.id and 55 < seconds_left <= 60


@pytest.mark.django_db
def test_a_duplicate_reports_the_existing_jobs_real_status():
    first = unique_report.enqueue(7)
    execute(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', return_value = '\"done\"', finished_at = now() WHERE id = %s",
        [int(first.id)],
    )

    again = unique_report.enqueue(7)

    assert again.id == first.id
    assert again.status == "SUCCESSFUL" and again.return_value == "done"


@pytest.mark.django_db
def test_different_arguments_are_different_jobs():
    ids = {unique_report.enqueue(7).id, unique_report.enqueue(8).id, unique_report.enqueue(7, kind="weekly").id}

    assert len(ids) == 3 and jobs_of(unique_report) == 3


@pytest.mark.django_db
def test_two_tasks_with_the_same_arguments_do_not_collide():
    report = unique_report.enqueue(7)
    invoice = unique_invoice.enqueue(7)

    assert report.id != invoice.id
    assert job_row(invoice.id)["task_path"] == "tests.taskapp.tasks.unique_invoice"


@pytest.mark.django_db
def test_a_unique_key_naming_an_argument_ignores_the_other_arguments():
    first = unique_per_account.enqueue(7, note="first")
    again = unique_per_account.enqueue(account_id=7, note="second")
    other = unique_per_account.enqueue(8, note="first")

    assert again.id == first.id != other.id
    assert again.kwargs == {"note": "first"} and again.args == [7]  # the existing job's arguments
    assert jobs_of(unique_per_account) == 2


@pytest.mark.django_db
def test_a_unique_key_callable_decides_what_is_the_same():
    first = unique_per_order.enqueue({"id": 3, "total": 10})
    again = unique_per_order.enqueue(order={"id": 3, "total": 99})
    other = unique_per_order.enqueue({"id": 4, "total": 10})

    assert again.id == first.id != other.id
    assert jobs_of(unique_per_order) == 2


@pytest.mark.django_db
def test_after_the_ttl_a_new_job_is_stored():
    first = unique_brief.enqueue(1)
    assert unique_brief.enqueue(1).id == first.id
    key = compute_unique_key(unique_brief, (1,), {})

    wait_until(lambda: unique_row(key)[1] < 0, timeout=30, message="the key to expire")
    later = unique_brief.enqueue(1)

    assert later.id != first.id
    assert jobs_of(unique_brief) == 2
    assert str(unique_row(key)[0]) == later.id  # the key row was taken over, not added
    assert unique_brief.enqueue(1).id == later.id


@pytest.mark.django_db
def test_a_deleted_job_frees_its_key():
    first = unique_report.enqueue(7)
    execute("DELETE FROM shardq_job WHERE id = %s", [int(first.id)])

    again = unique_report.enqueue(7)

    assert again.id != first.id and job_row(again.id)["status"] == "READY"
    assert str(unique_row(compute_unique_key(unique_report, (7,), {}))[0]) == again.id


@pytest.mark.django_db
def test_bad_arguments_are_refused_even_when_the_key_is_taken():
    unique_per_account.enqueue(7)

    with pytest.raises(InvalidTask, match="keyword argument 'note' is not JSON"):
        unique_per_account.enqueue(7, note=object())


@pytest.mark.django_db
def test_only_an_inserted_job_sends_task_enqueued():
    sent = []

    def receiver(sender, task_result, **kwargs):
        sent.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = unique_report.enqueue(7)
        unique_report.enqueue(7)
    finally:
        task_enqueued.disconnect(receiver)

    assert sent == [first.id]


@pytest.mark.django_db
def test_a_long_key_is_unique_too():
    first = unique_report.enqueue(7, kind="x" * 5000)

    assert unique_report.enqueue(7, kind="x" * 5000).id == first.id
    assert unique_report.enqueue(7, kind="x" * 4999).id != first.id


@pytest.mark.django_db
def test_using_keeps_the_task_unique():
    first = unique_report.using(priority=50).enqueue(7)

    assert unique_report.enqueue(7).id == first.id
    assert job_row(first.id)["priority"] == 50


# -- enqueue_many ------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_many_of_a_unique_task_collapses_duplicates_onto_the_first():
    before = unique_report.enqueue(1)

    results = shardq.enqueue_many(
        unique_report,
        [((1,), {}), ((2,), {}), ((), {"account_id": 2}), ((3,), {}), ((2,), {})],
    )

    assert [r.id for r in results] == [before.id, results[1].id, results[1].id, results[3].id, results[1].id]
    assert len({before.id, results[1].id, results[3].id}) == 3
    assert jobs_of(unique_report) == 3
    assert results[2] is not results[1]  # one result object a call


@pytest.mark.django_db
def test_enqueue_many_of_a_unique_task_stores_nothing_when_one_call_is_bad():
    with pytest.raises(InvalidTask):
        shardq.enqueue_many(unique_per_account, [((1,), {}), ((2,), {"note": object()})])

    assert jobs_of(unique_per_account) == 0


# -- transactions and other connections --------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_frees_the_key_for_the_next():
    with pytest.raises(Rollback), transaction.atomic():
        dropped = unique_report.enqueue(7)
        assert unique_report.enqueue(7).id == dropped.id  # taken inside the transaction
        raise Rollback

    kept = unique_report.enqueue(7)

    assert kept.id != dropped.id
    assert job_row(dropped.id) is None and job_row(kept.id) is not None
    assert jobs_of(unique_report) == 1


@pytest.mark.django_db(transaction=True)
def test_the_key_is_invisible_to_other_connections_until_the_caller_commits(second_connection):
    key = compute_unique_key(unique_report, (7,), {})
    with transaction.atomic():
        unique_report.enqueue(7)
        seen = second_connection.execute("SELECT 1 FROM shardq_unique WHERE key = %s", [key]).fetchone()
    assert seen is None
    assert second_connection.execute("SELECT 1 FROM shardq_unique WHERE key = %s", [key]).fetchone()


@pytest.mark.django_db(transaction=True)
def test_a_second_enqueue_waits_for_the_first_transaction_and_gets_its_job(second_connection):
    with transaction.atomic():
        first = unique_report.enqueue(7)
        thread, outcome = in_thread(lambda: unique_report.enqueue(7))
        wait_until(lambda: lock_waiters(second_connection) == 1, timeout=10, message="the second enqueue to wait")

    assert joined(thread, outcome).id == first.id
    assert jobs_of(unique_report) == 1


@pytest.mark.django_db(transaction=True)
def test_a_second_enqueue_inserts_when_the_first_transaction_rolls_back(second_connection):
    with pytest.raises(Rollback), transaction.atomic():
        dropped = unique_report.enqueue(7)
        thread, outcome = in_thread(lambda: unique_report.enqueue(7))
        wait_until(lambda: lock_waiters(second_connection) == 1, timeout=10, message="the second enqueue to wait")
        raise Rollback

    kept = joined(thread, outcome)
    assert kept.id != dropped.id
    assert job_row(kept.id)["status"] == "READY" and job_row(dropped.id) is None
    assert str(unique_row(compute_unique_key(unique_report, (7,), {}))[0]) == kept.id


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_from_many_connections_store_one_job():
    start = threading.Barrier(4)

    def enqueue():
        start.wait()
        return unique_report.enqueue(7).id

    runs = [in_thread(enqueue) for _ in range(4)]
    ids = {joined(thread, outcome) for thread, outcome in runs}

    assert len(ids) == 1 and jobs_of(unique_report) == 1


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_sends_no_notify(second_connection):
    unique_report.enqueue(7)
    second_connection.execute("LISTEN shardq")
    reset_task_backends()  # another process: the table answers, not the LRU

    with CaptureQueriesContext(connection) as queries:
        unique_report.enqueue(7)
    assert len(queries) == 2

    assert list(second_connection.notifies(timeout=0.3)) == []


# -- the per-process LRU -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_repeated_duplicate_is_served_from_the_lru_without_a_query():
    first = unique_report.enqueue(7)  # autocommit: committed, so cached at once

    with CaptureQueriesContext(connection) as queries:
        again = unique_report.enqueue(account_id=7)

    assert len(queries) == 0
    assert again.id == first.id and again.status == "READY"
    assert again is not first
    again.refresh()  # reads the table
    assert again.status == "READY" and again.id == first.id


@pytest.mark.django_db(transaction=True)
def test_a_holder_named_by_the_database_is_cached_too():
    holder = joined(*in_thread(lambda: unique_report.enqueue(7)))  # another connection's backend

    with CaptureQueriesContext(connection) as queries:
        assert unique_report.enqueue(7).id == holder.id
    assert len(queries) == 2  # insert_unique_job, then get_job
    with CaptureQueriesContext(connection) as queries:
        assert unique_report.enqueue(7).id == holder.id
    assert len(queries) == 0


@pytest.mark.django_db(transaction=True)
def test_the_lru_learns_an_insert_only_when_the_caller_commits():
    key = compute_unique_key(unique_report, (7,), {})
    with transaction.atomic():
        unique_report.enqueue(7)
        unique_report.enqueue(7)  # the table's answer, from this transaction's own row
        assert cached(unique_report, key) is None

    assert cached(unique_report, key) is not None


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_never_fills_the_lru():
    key = compute_unique_key(unique_report, (7,), {})
    with pytest.raises(Rollback), transaction.atomic():
        unique_report.enqueue(7)
        unique_report.enqueue(7)
        raise Rollback

    assert cached(unique_report, key) is None
    with CaptureQueriesContext(connection) as queries:
        kept = unique_report.enqueue(7)
    assert len(queries) == 1 and job_row(kept.id) is not None


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_savepoint_never_fills_the_lru():
    key = compute_unique_key(unique_report, (7,), {})
    with transaction.atomic():
        with pytest.raises(Rollback), transaction.atomic():
            unique_report.enqueue(7)
            raise Rollback
        unique_report.enqueue(8)

    assert cached(unique_report, key) is None
    assert cached(unique_report, compute_unique_key(unique_report, (8,), {})) is not None


@pytest.mark.django_db(transaction=True)
def test_the_lru_deadline_ends_before_the_database_expiry():
    unique_report.enqueue(7)
    key = compute_unique_key(unique_report, (7,), {})

    deadline, _ = cached(unique_report, key)
    _, database_left = unique_row(key)
    local_left = deadline - time.monotonic()  # read after the database's clock: the later, the less left

    assert 0 < local_left <= database_left - UNIQUE_CACHE_MARGIN_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_key_with_less_than_the_margin_left_is_never_cached():
    first = unique_fleeting.enqueue(1)  # unique_for=0.3 s, under the margin

    assert cached(unique_fleeting, compute_unique_key(unique_fleeting, (1,), {})) is None
    key = compute_unique_key(unique_fleeting, (1,), {})
    wait_until(lambda: unique_row(key)[1] < 0, timeout=30, message="the key to expire")
    assert unique_fleeting.enqueue(1).id != first.id


@pytest.mark.django_db(transaction=True)
def test_a_job_deleted_elsewhere_is_still_answered_from_the_lru_until_its_deadline():
    # The documented limit of a cache without invalidation: the table frees
    # the key at once, this process's cache keeps the deleted job until its
    # deadline (at most unique_for).
    first = unique_report.enqueue(7)
    execute("DELETE FROM shardq_job WHERE id = %s", [int(first.id)])

    assert unique_report.enqueue(7).id == first.id
    reset_task_backends()  # another process, no cache
    assert unique_report.enqueue(7).id != first.id


@pytest.mark.django_db(transaction=True)
def test_a_unique_cache_size_of_zero_turns_the_lru_off():
    from django.conf import settings

    tasks = {"default": {**settings.TASKS["default"], "OPTIONS": {"UNIQUE_CACHE_SIZE": 0}}}
    with override_settings(TASKS=tasks):
        reset_task_backends()
        first = unique_report.enqueue(7)
        with CaptureQueriesContext(connection) as queries:
            assert unique_report.enqueue(7).id == first.id
        assert len(queries) == 2
        assert unique_report.get_backend().unique.cache is None


def test_a_bad_unique_cache_size_fails_e007():
    for size in (-1, 1.5, "100", True):
        backend = ShardqBackend("other_tasks", {"OPTIONS": {"UNIQUE_CACHE_SIZE": size}})
        messages = [m for m in backend.check() if m.id == "shardq.E007"]
        assert len(messages) == 1 and "UNIQUE_CACHE_SIZE" in messages[0].msg
    assert not [m for m in ShardqBackend("t", {"OPTIONS": {"UNIQUE_CACHE_SIZE": 0}}).check() if m.id == "shardq.E007"]
