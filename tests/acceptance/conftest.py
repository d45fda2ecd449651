import pytest

from tests.workers import WorkerPool


@pytest.fixture
def workers(tmp_path, transactional_db):
    from shardq.db.store import ensure_shards

    ensure_shards()  # a transactional test's flush may have removed the rows
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()
