"""The limited claim into owned slots (``claim_limited_owned``, docs/limits.md):
one statement that takes, in claim order, the jobs every key of has room,
no key past its room, and passes over jobs of limits without room here."""

import json

import pytest

from shardq.db.store import WorkerStore
from shardq.worker.jobs import ClaimedJob
from tests.helpers import job_factory, leased_shard_factory, sql

pytestmark = pytest.mark.django_db(transaction=True)

A, B, Q = "t:app.a", "t:app.b", "q:emails"


def limited(count: int, keys: list[str], shard: int = 0) -> list[int]:
    ids = job_factory(count, shard=shard)
    sql("UPDATE shardq_job SET limit_keys = %s::jsonb WHERE id = ANY(%s)", [json.dumps(keys), ids])
    return ids


def claim(worker: str, rooms: dict[str, int], limit: int = 100) -> list[ClaimedJob]:
    store = WorkerStore(application_name="test-claim-limited-owned")
    try:
        return store.claim_limited_owned(
            worker=worker,
            shards=[0, 1],
            pool="*",
            queues=None,
            exclude_queues=None,
            backend=None,
            per_shard=100,
            rooms=rooms,
            limit=limit,
            row_factory=ClaimedJob,
        )
    finally:
        store.close()


def test_no_key_gets_more_than_its_room_and_jobs_of_keys_without_room_keep_their_place():
    worker, _ = leased_shard_factory([0, 1])
    a = limited(5, [A], shard=0)
    b = limited(5, [B], shard=1)
    both = limited(3, [Q, A], shard=1)  # counts against A and the queue
    rows = claim(worker, {A: 3, Q: 10})
    taken = [job.id for job in rows]
    # A's room is 3, in claim order over both shards (ids are claim order
    # here: one priority, one run_after each): its first three jobs; B has
    # no room here, and the jobs with A and the queue come after A's own.
    assert sorted(taken) == a[:3]
    assert all(job.limit_keys == [A] for job in rows)
    status = dict(sql("SELECT id, status FROM shardq_job WHERE id = ANY(%s)", [a + b + both]))
    assert [status[i] for i in a] == ["CLAIMED"] * 3 + ["READY"] * 2
    assert {status[i] for i in b + both} == {"READY"}
    # With room in both keys, a job of two keys is taken when both have it.
    rows = claim(worker, {A: 4, Q: 1})
    assert sorted(job.id for job in rows) == [*a[3:], both[0]]


def test_the_claim_takes_at_most_its_limit_and_nothing_of_shards_it_does_not_hold():
    worker, _ = leased_shard_factory([0])
    mine = limited(4, [A], shard=0)
    limited(4, [A], shard=1)  # not held
    rows = claim(worker, {A: 10}, limit=3)
    assert [job.id for job in rows] == mine[:3]
