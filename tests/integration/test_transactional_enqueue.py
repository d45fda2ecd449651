"""A job exists exactly when the caller's transaction commits."""

import pytest
from django.db import transaction

import shardq
from tests.helpers import job_row
from tests.taskapp.tasks import add, keyed

from .conftest import job_count


class Rollback(Exception):
    pass


def visible_to(conn, job_id) -> bool:
    return conn.execute("SELECT 1 FROM shardq_job WHERE id = %s", [int(job_id)]).fetchone() is not None


@pytest.mark.django_db
def test_a_rolled_back_atomic_block_leaves_no_job():
    before = job_count()
    with pytest.raises(Rollback), transaction.atomic():
        result = add.enqueue(1, 2)
        assert job_row(result.id) is not None  # visible inside the block
        raise Rollback

    assert job_row(result.id) is None
    assert job_count() == before


@pytest.mark.django_db
def test_a_rolled_back_bulk_enqueue_leaves_no_job():
    before = job_count()
    with pytest.raises(Rollback), transaction.atomic():
        shardq.enqueue_many(add, [((i, i), {}) for i in range(100)])
        raise Rollback

    assert job_count() == before


@pytest.mark.django_db
def test_a_rolled_back_savepoint_drops_only_its_own_jobs():
    with transaction.atomic():
        kept = add.enqueue(1, 1)
        with pytest.raises(Rollback), transaction.atomic():
            dropped = add.enqueue(2, 2)
            raise Rollback

    assert job_row(kept.id) is not None
    assert job_row(dropped.id) is None


@pytest.mark.django_db(transaction=True)
def test_a_job_is_invisible_to_other_connections_until_the_caller_commits(second_connection):
    with transaction.atomic():
        result = keyed.enqueue(user_id=42)
        assert not visible_to(second_connection, result.id)

    assert visible_to(second_connection, result.id)
    assert job_row(result.id)["status"] == "READY"


@pytest.mark.django_db(transaction=True)
def test_a_job_enqueued_in_autocommit_is_visible_at_once(second_connection):
    result = add.enqueue(1, 2)

    assert visible_to(second_connection, result.id)


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_never_shows_the_job_to_anyone(second_connection):
    with pytest.raises(Rollback), transaction.atomic():
        result = add.enqueue(1, 2)
        raise Rollback

    assert not visible_to(second_connection, result.id)


@pytest.mark.django_db(transaction=True)
def test_the_wake_up_notify_is_delivered_at_commit_only(second_connection):
    second_connection.execute("LISTEN shardq")
    with transaction.atomic():
        result = keyed.enqueue(user_id=42)
        before_commit = list(second_connection.notifies(timeout=0.2))

    after_commit = list(second_connection.notifies(timeout=5.0, stop_after=1))

    assert before_commit == []
    row = job_row(result.id)
    assert [n.payload for n in after_commit] == [f"{row['shard']}:{row['priority']}"]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_sends_no_notify(second_connection):
    second_connection.execute("LISTEN shardq")
    with pytest.raises(Rollback), transaction.atomic():
        add.enqueue(1, 2)
        raise Rollback

    assert list(second_connection.notifies(timeout=0.3)) == []
