"""A key at its cap holds back only its own jobs (docs/limits.md, "Limits
by the shard key"): a real worker whose shard has a backlog of one key's
jobs, limited to 2 at once, runs every other key's jobs beside them, not
after them. Without the demand leaving gated jobs out and the claim
passing over full keys, the buffer fills with the hot key's waiting jobs
and the others wait for the whole backlog."""

import pytest

import shardq
from shardq.core.hashing import shard_key_hash
from tests.acceptance.test_limits import read_ledger, running_profile
from tests.conftest import wait_until
from tests.taskapp import key_limit_tasks as t
from tests.workers import WorkerPool, scalar, worker_id_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workers(tmp_path):
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()


def test_a_hot_key_at_its_cap_does_not_hold_back_other_keys_jobs(workers, tmp_path):
    ledger = tmp_path / "ledger"
    proc = workers.start("--concurrency", "8", env={"SHARDQ_LIMIT_LEDGER": str(ledger)})
    worker_id_of(proc.pid)
    # 300 jobs of one key (2 at a time, 0.1 s each: 15 s of backlog), then,
    # once the worker has been at it for a second (20 more of them run: 40
    # more ledger lines, a start and an end each), 60 jobs over 30 other keys
    # of the same shard: behind the whole backlog in the shard's claim order.
    shard = shard_key_hash("hot") & 63
    keys = [k for k in (f"k{i}" for i in range(100_000)) if shard_key_hash(k) & 63 == shard][:30]
    hot = shardq.enqueue_many(t.per_account_sleep, [(("hot",), {}) for _ in range(300)])
    wait_until(lambda: ledger.exists() and len(read_ledger(ledger)) >= 10, message="the hot key's first jobs")
    wait_until(lambda: len(read_ledger(ledger)) >= 50, message="a second of the hot key's jobs at its cap")
    rest = shardq.enqueue_many(t.per_account_sleep, [((keys[i % 30],), {}) for i in range(60)])
    rest_ids = [int(r.id) for r in rest]
    wait_until(
        lambda: (
            scalar("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [rest_ids]) == 60
        ),
        timeout=12,
        message="the other keys' 60 jobs, while the hot key's backlog still runs",
    )
    hot_left = scalar(
        "SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status <> 'SUCCESSFUL'", [[int(r.id) for r in hot]]
    )
    assert hot_left > 100, "the hot key's backlog was not what the other keys waited behind"
    rows = read_ledger(ledger)
    assert max(n for _, n in running_profile(rows, "hot")) == 2
    for key in keys:
        assert max(n for _, n in running_profile(rows, key)) <= 2
