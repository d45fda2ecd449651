"""`make bench` compares shardq with a bare psycopg loop (bench/limit.py) that
runs shardq's own statements from shardq/db/sql with the parameters the backend
and the worker pass. When a statement gains a parameter or a column, that loop
must follow. This test runs it at a tiny size against the test database, so
`make bench` cannot break unnoticed (it did once this session, after a merge
added parameters to insert_job)."""

import sys
from pathlib import Path

import pytest

from tests.helpers import scalar
from tests.workers import database_url

pytestmark = pytest.mark.django_db(transaction=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import limit  # noqa: E402


def test_the_bare_loop_enqueues_and_drains_with_the_current_statements():
    from shardq.db.store import ensure_shards

    ensure_shards()
    url = database_url()
    limit.insert_enqueue(url, 5, transaction=True)
    limit.insert_enqueue(url, 5, transaction=False)
    limit.copy_enqueue(url, 5)
    ready = scalar("SELECT count(*) FROM shardq_job WHERE status = 'READY'")
    assert ready >= 15  # (the INSERT loops warm up with one more statement each)
    # Every row where a real enqueue would put it: the shard from the key hash.
    assert scalar("SELECT count(*) FROM shardq_job WHERE shard <> key_hash & 63") == 0
    worker = limit.new_worker_id()
    shards = list(range(64))
    limit.own_shards(url, worker, shards)
    drainer = limit.Drainer(url, worker, shards)
    try:
        drainer.warm()
        assert drainer.drain_available() == ready
    finally:
        drainer.conn.close()
    assert scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == ready
