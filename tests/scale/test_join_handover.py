"""Issue 13's last open figure: no shard without a live owner for more than
100 ms while a worker joins a busy one (default HEARTBEAT 10 s, LEASE_TTL
30 s, as a project has them).

The holder gives back its excess in batches: the idle shards at once, a
shard whose job still runs once that job ends. Each batch is one release
statement that NOTIFYs the lease channel at its commit; the joiner, below
its share, claims on that notice before anything else. Measured on the
database's clock from the shard history: for every shard the holder
released, the time until the joiner's claim of it.
"""

import os

from tests.conftest import wait_until
from tests.faults.harness import insert_jobs
from tests.workers import query, shards_by_owner, status_counts, worker_id_of

DEFAULTS = {"SHARDQ_HEARTBEAT": "10", "SHARDQ_LEASE_TTL": "30", "SHARDQ_POLL_INTERVAL": "1"}
# The 100 ms is a figure for `make scale` (SHARDQ_FULL_SCALE=1) on a
# quiet machine. Under `make test`'s two xdist workers on two cores it came
# in at 238 ms once (one batch of 32, the joiner busy starting up), so CI
# bounds it by 2 s: still far inside the 10 s heartbeat the joiner would
# otherwise wait, so only the release's NOTIFY can meet it.
FULL = os.environ.get("SHARDQ_FULL_SCALE") == "1"
BOUND_SECONDS = 0.1 if FULL else 2.0


def test_a_joiner_claims_every_shard_a_busy_worker_releases_within_100ms(workers):
    a = workers.start("--concurrency", "4", env=DEFAULTS)
    first = worker_id_of(a.pid)
    wait_until(lambda: shards_by_owner() == {first: 64}, timeout=30)
    # Short sleeping jobs keep the holder's shards busy, so its releases come
    # in several batches, and give the joiner work as soon as it claims.
    insert_jobs(
        query, "tests.taskapp.scale_tasks.nap", 4000, kwargs_sql="jsonb_build_object('seconds', 0.02)", max_attempts=1
    )
    wait_until(lambda: status_counts().get("SUCCESSFUL", 0) >= 200, timeout=60, message="the holder to run jobs")
    b = workers.start("--concurrency", "4", env=DEFAULTS)
    second = worker_id_of(b.pid)
    wait_until(
        lambda: shards_by_owner() == {first: 32, second: 32},
        timeout=10,
        message=lambda: f"the joiner to hold its share: {shards_by_owner()}",
    )
    gaps = query(
        "SELECT r.shard, extract(epoch FROM c.at - r.at)::float8 FROM shardq_shard_event r"
        " JOIN LATERAL (SELECT at FROM shardq_shard_event c WHERE c.shard = r.shard AND c.reason = 'claim'"
        "   AND c.worker = %s AND c.at >= r.at ORDER BY c.at LIMIT 1) c ON true"
        " WHERE r.reason = 'release' AND r.worker = %s",
        [second, first],
    )
    assert len(gaps) == 32, gaps
    batches = query(
        "SELECT count(DISTINCT xmin::text) FROM shardq_shard_event WHERE reason = 'release' AND worker = %s", [first]
    )[0][0]
    longest = max(gap for _, gap in gaps)
    print(f"[faults] join_handover: releases={len(gaps)}, batches={batches}, longest_unowned_s={longest:.3f}")
    assert longest <= BOUND_SECONDS, sorted(gaps, key=lambda g: -g[1])[:5]
