"""Queue pools (issue 12, DESIGN §4.8): shards are leased per pool, the set of
queues a worker serves, so every pool covers every shard of its queues.

Real ``shardq_worker`` processes, three pools side by side: ``default``;
``emails``; ``reports,default`` (overlapping the first on ``default``)."""

import itertools
import json
import os
import signal
from collections import defaultdict

import pytest

import shardq
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import WorkerPool, query, scalar, worker_id_of

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 64


@pytest.fixture
def workers(tmp_path):
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()


def leases(pool: str) -> dict[int, tuple[str | None, int]]:
    """shard -> (live owner or None, claim_version) of one pool's lease rows."""
    rows = query(
        "SELECT shard, CASE WHEN lease_expires > clock_timestamp() THEN owner::text END, claim_version "
        "FROM shardq_shard WHERE pool = %s AND shard < %s",
        [pool, SHARDS],
    )
    return {shard: (owner, version) for shard, owner, version in rows}


def held_by(pool: str) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for owner, _ in leases(pool).values():
        if owner is not None:
            counts[owner] += 1
    return dict(counts)


def enqueue(queue: str, n: int, start: int = 0) -> list[int]:
    results = shardq.enqueue_many(tasks.add.using(queue_name=queue), [((i, 1), {}) for i in range(start, start + n)])
    return [int(r.id) for r in results]


def test_three_pools_cover_their_queues_and_a_sigkill_moves_only_its_pools_shards(workers):
    a1 = workers.start("--queues", "default", "--concurrency", "4")
    a2 = workers.start("--queues", "default", "--concurrency", "4")
    b = workers.start("--queues", "emails", "--concurrency", "4")
    c = workers.start("--queues", "reports,default", "--concurrency", "4")
    ids = {proc: worker_id_of(proc.pid) for proc in (a1, a2, b, c)}
    # Each pool holds all 64 shards; the two workers of "default" share them.
    wait_until(
        lambda: (
            held_by("default") == {ids[a1]: 32, ids[a2]: 32}
            and held_by("emails") == {ids[b]: SHARDS}
            and held_by("default,reports") == {ids[c]: SHARDS}
        ),
        timeout=60,
        message="each pool to hold every shard, shared out within the pool",
    )
    assert scalar("SELECT count(*) FROM shardq_worker WHERE pool = 'default'") == 2

    first = {q: enqueue(q, 500) for q in ("default", "emails", "reports")}
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == 1500,
        timeout=120,
        message="the first 1,500 jobs to finish",
    )

    # SIGKILL one worker of "default", idle: its 32 shards move to the other
    # worker of the pool; no lease of another pool changes hands.
    others_before = {pool: leases(pool) for pool in ("emails", "default,reports")}
    os.killpg(a1.pid, signal.SIGKILL)
    a1.wait(timeout=10)
    wait_until(
        lambda: held_by("default") == {ids[a2]: SHARDS},
        timeout=60,
        message="the killed worker's shards to move to the other worker of its pool",
    )
    assert {pool: leases(pool) for pool in ("emails", "default,reports")} == others_before
    takeovers = dict(query("SELECT pool, count(*) FROM shardq_shard_event WHERE reason = 'takeover' GROUP BY pool"))
    assert takeovers == {"default": 32}

    second = {q: enqueue(q, 500, start=500) for q in ("default", "emails", "reports")}
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == 3000,
        timeout=120,
        message="all 3,000 jobs to finish",
    )

    # Every job ran exactly once, by a worker whose pool serves its queue.
    serves = {
        "default": {ids[a1], ids[a2], ids[c]},
        "emails": {ids[b]},
        "reports": {ids[c]},
    }
    rows = query("SELECT id, queue_name, attempts, worker_ids, return_value FROM shardq_job")
    assert len(rows) == 3000
    ran_by = defaultdict(set)
    for job_id, queue, attempts, worker_ids_json, _ in rows:
        worker_ids = json.loads(worker_ids_json)
        assert attempts == 1 and len(worker_ids) == 1, (job_id, attempts, worker_ids)
        assert worker_ids[0] in serves[queue], (job_id, queue, worker_ids)
        ran_by[queue].add(worker_ids[0])
    assert sorted(r[0] for r in rows) == sorted(i for d in (first, second) for q in d.values() for i in q)
    assert ran_by["emails"] == {ids[b]} and ran_by["reports"] == {ids[c]}


def test_overlapping_pools_keep_each_keys_order(workers, tmp_path):
    trace = tmp_path / "trace.txt"
    env = {"SHARDQ_TEST_TRACE": str(trace)}
    keys, per_key = 16, 12
    workers.start("--queues", "default", "--concurrency", "4", env=env)
    workers.start("--concurrency", "4", env=env)  # the pool "*": every queue, default included
    wait_until(lambda: held_by("default") and held_by("*"), timeout=60, message="both pools to hold shards")
    # One transaction: both pools are woken by the same commit.
    shardq.enqueue_many(
        tasks.ordered_step,
        [((), {"user_id": k, "n": n, "sleep": 0.03}) for n in range(per_key) for k in range(keys)],
    )
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == keys * per_key,
        timeout=120,
        message="every ordered job to finish",
    )
    runs = defaultdict(list)
    for line in trace.read_text().splitlines():
        began, ended, key, n = line.split()
        runs[int(key)].append((float(began), float(ended), int(n)))
    assert sorted(runs) == list(range(keys))
    for key, spans in runs.items():
        spans.sort()
        assert [n for _, _, n in spans] == list(range(per_key)), (key, spans)
        for (_, ended, _), (began, _, _) in itertools.pairwise(spans):
            assert began >= ended, (key, spans)  # never two of one key at once
    ran_by = {row[0] for row in query("SELECT DISTINCT worker_ids->>0 FROM shardq_job")}
    assert len(ran_by) == 2, "both pools ran ordered jobs"
