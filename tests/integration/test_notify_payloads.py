"""Every statement that makes a job READY wakes workers with ``shard:priority``
(``parse_notify`` in shardq/worker/fetcher.py reads it): a worker whose
memory holds only lower priorities claims the new job out of turn."""

import pytest
from django.db import connection

import shardq
from shardq.conf import get_config
from shardq.db.queries import QUERIES
from shardq.worker.fetcher import parse_notify
from tests.helpers import wait_until
from tests.taskapp.tasks import add, unique_report

from .conftest import execute

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listening(second_connection):
    """The payloads NOTIFYed on shardq's channel from now on (a callable)."""
    second_connection.execute(f'LISTEN "{get_config().channel}"')
    seen: list[str] = []

    def payloads(count: int) -> list[str]:
        def arrived() -> bool:
            seen.extend(note.payload for note in second_connection.notifies(timeout=0.05, stop_after=count))
            return len(seen) >= count

        wait_until(arrived, timeout=10, message=f"{count} NOTIFYs (got {seen})")
        return sorted(seen)

    return payloads


def shard_of(job_id) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT shard FROM shardq_job WHERE id = %s", [int(job_id)])
        return cursor.fetchone()[0]


def test_enqueue_notifies_the_jobs_shard_and_priority(listening):
    result = add.using(priority=42).enqueue(1, 2)
    assert listening(1) == [f"{shard_of(result.id)}:42"]
    assert parse_notify(f"{shard_of(result.id)}:42", 64) == (shard_of(result.id), 42)


def test_a_unique_enqueue_notifies_the_shard_and_a_negative_priority(listening):
    result = unique_report.using(priority=-7).enqueue(account_id=3)
    assert listening(1) == [f"{shard_of(result.id)}:-7"]


def test_bulk_enqueue_notifies_each_shard_once_with_the_priority(listening):
    results = shardq.enqueue_many(add.using(priority=100), [((n, n), {}) for n in range(40)])
    shards = sorted({shard_of(result.id) for result in results})
    assert listening(len(shards)) == sorted(f"{shard}:100" for shard in shards)


def test_the_admin_retry_notifies_the_shard_and_the_priority_held_to_djangos_range(listening):
    result = add.using(priority=9).enqueue(1, 1)
    listening(1)
    # A row written by hand may hold a priority Django would refuse.
    execute("UPDATE shardq_job SET status = 'FAILED', priority = 500 WHERE id = %s", [int(result.id)])
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["admin_retry_failed_jobs"],
            {"ids": [int(result.id)], "notify": True, "channel": get_config().channel},
        )
    assert listening(2) == sorted([f"{shard_of(result.id)}:9", f"{shard_of(result.id)}:100"])
