"""shardq.enqueue_many: many calls of one task in one round of statements (see test_enqueue_paths)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

import shardq
from tests.helpers import job_row
from tests.taskapp.tasks import add, keyed

from .conftest import job_count

pytestmark = pytest.mark.django_db


def test_results_come_back_in_call_order_with_the_ids_of_their_rows():
    calls = [((user_id,), {"note": f"n{user_id}"}) for user_id in range(300)]

    results = shardq.enqueue_many(keyed, calls)

    assert [r.args for r in results] == [[user_id] for user_id in range(300)]
    ids = [int(r.id) for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 300
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, args::text, kwargs::text FROM shardq_job WHERE id = ANY(%s)", [ids])
        stored = {job_id: (args, kwargs) for job_id, args, kwargs in cursor.fetchall()}
    for result in results:
        user_id = result.args[0]
        assert stored[int(result.id)] == (f"[{user_id}]", f'{{"note": "n{user_id}"}}')


def test_every_result_is_a_ready_task_result():
    results = shardq.enqueue_many(add, [((1, 2), {}), ((), {"a": 3, "b": 4})])

    for result in results:
        assert result.status == TaskResultStatus.READY
        assert result.task is add
        assert result.backend == "default"
        assert result.enqueued_at is not None
        assert result.errors == [] and result.worker_ids == []
    assert results[1].kwargs == {"a": 3, "b": 4}
    assert add.get_backend().get_result(results[1].id).kwargs == {"a": 3, "b": 4}


def test_the_tasks_options_apply_to_every_job():
    when = timezone.now() + timedelta(minutes=5)

    results = shardq.enqueue_many(
        add.using(priority=30, queue_name="emails", run_after=when), [((n, n), {}) for n in range(5)]
    )

    for result in results:
        row = job_row(result.id)
        assert (row["priority"], row["queue_name"], row["run_after"]) == (30, "emails", when)


def test_keyed_jobs_get_their_shards():
    results = shardq.enqueue_many(keyed, [((42,), {}), ((), {"user_id": 42})])

    rows = [job_row(r.id) for r in results]
    assert rows[0]["shard"] == rows[1]["shard"] == keyed.get_backend().rows.job_row(keyed, (42,), {})["key_hash"] & 63
    assert rows[0]["shard_key"] == rows[1]["shard_key"] == "42"


def test_one_bad_call_refuses_the_whole_batch_and_stores_nothing():
    before = job_count()
    calls = [((n, n), {}) for n in range(50)] + [((1, object()), {})] + [((n, n), {}) for n in range(50)]

    with pytest.raises(InvalidTask, match="positional argument 1 is not JSON"):
        shardq.enqueue_many(add, calls)

    assert job_count() == before


def test_no_calls_store_nothing():
    before = job_count()

    assert shardq.enqueue_many(add, []) == []
    assert job_count() == before


def test_calls_may_be_any_iterable_of_pairs():
    results = shardq.enqueue_many(add, ((((n, n)), {}) for n in range(3)))

    assert [r.args for r in results] == [[0, 0], [1, 1], [2, 2]]
