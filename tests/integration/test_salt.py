"""Hot-key salting: ``@shard_task(key=..., salt=N)`` spreads one key over N sub-keys."""

import pytest
from django.db import connection
from django.tasks.exceptions import InvalidTask

import shardq
from shardq import shard_task
from shardq.core.hashing import salted_key_hash, shard_key_hash
from shardq.tasks import validate_shard_options
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db


def shards_of(task_path: str) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT shard FROM shardq_job WHERE task_path = %s", [task_path])
        return {row[0] for row in cursor.fetchall()}


def test_a_salted_key_spreads_over_the_shards_of_its_sub_keys_and_keeps_its_key():
    shardq.enqueue_many(tasks.hot_account, [((42,), {"n": i}) for i in range(400)])
    tasks.hot_account.enqueue(42, n=400)
    expected = {salted_key_hash("42", n) & 63 for n in range(8)}
    assert shards_of(tasks.hot_account.module_path) == expected  # 400 jobs reach every sub-key
    assert len(expected) > 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT shard_key FROM shardq_job")
        assert cursor.fetchall() == [("42",)]


def test_without_salt_a_key_stays_on_one_shard():
    shardq.enqueue_many(tasks.keyed, [((42,), {}) for _ in range(50)])
    assert shards_of(tasks.keyed.module_path) == {shard_key_hash("42") & 63}


def test_a_salted_hashtag_key_spreads_by_its_tag():
    assert salted_key_hash("order:{7}:line:1", 3) == salted_key_hash("invoice:{7}", 3) == salted_key_hash("7", 3)
    assert salted_key_hash("7", 3) != salted_key_hash("7", 4)


@pytest.mark.parametrize("salt", [0, 1, True, 2.5, "8", 16385])
def test_a_bad_salt_fails_at_definition(salt):
    with pytest.raises(InvalidTask, match="salt must be a whole number of sub-keys from 2 to"):
        validate_shard_options(shard_task(key="a", salt=salt)(_two_args))


def test_salt_and_ordered_cannot_go_together():
    with pytest.raises(InvalidTask, match="cannot run in the key's order: drop ordered=True, or drop salt"):
        validate_shard_options(shard_task(key="a", salt=4, ordered=True)(_two_args))


def _two_args(a, b=0):
    return a
