"""Concurrency and rate limits across real workers (issue 15, docs/limits.md).

Three ``shardq_worker`` processes, concurrency 8 each, run tasks that sleep
200 ms and append their start and end to a ledger file
(tests/taskapp/limit_tasks.py); the limits are checked on the ledger's
intervals, not on shardq's own bookkeeping. CI-sized runs; ``make
limits-full`` (SHARDQ_LIMITS_FULL=1) runs the 30-second rate figure.
"""

import itertools
import json
import os
import signal
import time
from pathlib import Path

import pytest

import shardq
from shardq.core.limits import parse_rate
from tests.conftest import wait_until
from tests.taskapp import limit_tasks
from tests.workers import FAST_LEASES, WorkerPool, query, scalar, worker_id_of

pytestmark = pytest.mark.django_db(transaction=True)

FULL = bool(os.environ.get("SHARDQ_LIMITS_FULL"))
RATE_SECONDS = 30.0 if FULL else 6.0
TTL = float(FAST_LEASES["SHARDQ_LEASE_TTL"])
HEARTBEAT = float(FAST_LEASES["SHARDQ_HEARTBEAT"])


@pytest.fixture
def workers(tmp_path):
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()


def read_ledger(path: Path) -> list[tuple[str, int, float, int, str]]:
    """(event, job id, time, pid, partition) lines, in time order."""
    rows = []
    for line in path.read_text().splitlines():
        event, job, at, pid, *part = line.split()
        rows.append((event, int(job), float(at), int(pid), part[0] if part else ""))
    return sorted(rows, key=lambda r: (r[2], r[0] == "start"))  # an end before a start at one instant


def running_profile(rows, part=None) -> list[tuple[float, int]]:
    """(time, jobs running from then on) at every start and end."""
    running, profile = 0, []
    for event, _, at, _, p in rows:
        if part is not None and p != part:
            continue
        running += 1 if event == "start" else -1
        profile.append((at, running))
    return profile


def time_at_least(profile, level: int) -> tuple[float, float]:
    """(seconds with >= level running, span from the first start to the last end)."""
    covered = 0.0
    for (at, running), (next_at, _) in itertools.pairwise(profile):
        if running >= level:
            covered += next_at - at
    return covered, profile[-1][0] - profile[0][0]


def longest_below(profile, level: int, until: float) -> float:
    """The longest stretch with fewer than ``level`` running, from the first
    start to ``until`` (the last start: from then on the backlog is gone)."""
    longest, since = 0.0, None
    for at, running in profile:
        if at > until:
            break
        if running < level and since is None:
            since = at
        elif running >= level and since is not None:
            longest, since = max(longest, at - since), None
    if since is not None:
        longest = max(longest, until - since)
    return longest


def longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(sorted(times))), default=0.0)


# The lower bounds (the limit is reached, not only never exceeded) at the
# issue's figures under `make limits-full`; in CI, on a machine whose load
# is not ours, the share of time at the limit measures the machine as much
# as the limiter. There the tests catch what a limiter that holds slots or
# tokens back looks like, a stall: seconds with a backlog and a free slot
# or token, and half the work missing. (An excess is never tolerated.)
MIN_SHARE = 0.8 if FULL else 0.5
MIN_RATE_SHARE = 0.95 if FULL else 0.5
STALL_SECONDS = 2.0


def start_three(workers, ledger: Path, **env):
    procs = [
        workers.start(
            "--concurrency", "8", env={"SHARDQ_LIMIT_LEDGER": str(ledger), "SHARDQ_EXPECTED_WORKERS": "3", **env}
        )
        for _ in range(3)
    ]
    for proc in procs:
        worker_id_of(proc.pid)
    # Every worker holds its fair share of the shards (22/21/21) before the
    # jobs come. Three owners alone is not that: the first worker then still
    # hands shards over while the limited jobs run.
    wait_until(
        lambda: (
            sorted(
                n
                for (n,) in query(
                    "SELECT count(*) FROM shardq_shard WHERE pool = '*' AND owner IS NOT NULL "
                    "AND lease_expires > clock_timestamp() GROUP BY owner"
                )
            )
            == [21, 21, 22]
        ),
        message="three workers holding their fair shares",
    )
    return procs


def finished(ids: list[int]) -> bool:
    return scalar("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [ids]) == len(ids)


def test_max_concurrency_3_holds_across_three_workers_and_keeps_3_running(workers, tmp_path):
    ledger = tmp_path / "ledger"
    start_three(workers, ledger)
    results = shardq.enqueue_many(limit_tasks.three_at_once, [((i,), {}) for i in range(150)])
    ids = [int(r.id) for r in results]
    wait_until(lambda: finished(ids), timeout=120, message="150 limited jobs finished")
    rows = read_ledger(ledger)
    assert sum(1 for r in rows if r[0] == "start") == 150
    profile = running_profile(rows)
    assert max(running for _, running in profile) <= 3, "more than 3 ran at once across the workers"
    covered, span = time_at_least(profile, 3)
    pids = {r[3] for r in rows}
    print(f"[limits] max_concurrency=3: 3 running {covered / span:.0%} of {span:.1f}s, {len(pids)} workers ran jobs")
    # 150 jobs of 200 ms, 3 at once: 10 s of work. A slot kept idle by one
    # worker (the stall this once had: its claims found no more jobs of the
    # limit, so nothing gave its free slots back) shows here as seconds of
    # 1 or 2 running.
    assert covered >= MIN_SHARE * span, f"3 running only {covered:.2f}s of {span:.2f}s"
    last_start = max(r[2] for r in rows if r[0] == "start")
    stall = longest_below(profile, 3, last_start)
    assert stall <= STALL_SECONDS, f"fewer than 3 running for {stall:.2f}s in a row while jobs waited"
    # Slots go back once nothing waits for them.
    owned = "SELECT count(*) FROM shardq_limit_slot WHERE worker_id IS NOT NULL AND expires_at > clock_timestamp()"
    wait_until(lambda: scalar(owned) == 0, timeout=10, message="slots given back")


def test_rate_limit_20_a_second_holds_in_every_window_and_over_the_run(workers, tmp_path):
    ledger = tmp_path / "ledger"
    start_three(workers, ledger)
    rate, burst = 20, parse_rate("20/s").burst  # 2: a tenth of a second of the rate, documented
    shardq.enqueue_many(limit_tasks.twenty_a_second, [((i,), {}) for i in range(int(rate * RATE_SECONDS) + 200)])
    first = wait_until(lambda: ledger.exists() and read_ledger(ledger), message="a first start")
    t0 = first[0][2]
    wait_until(lambda: time.time() > t0 + RATE_SECONDS + 0.5, timeout=RATE_SECONDS + 30)
    starts = [r[2] for r in read_ledger(ledger) if r[0] == "start"]
    in_run = [t for t in starts if t < t0 + RATE_SECONDS]
    # Every 1-second window: the worst ones begin at a start.
    worst = max(sum(1 for u in starts if t <= u < t + 1.0) for t in in_run)
    expected = rate * RATE_SECONDS
    print(
        f"[limits] rate_limit=20/s over {RATE_SECONDS:.0f}s: {len(in_run)} starts "
        f"(expected {expected:.0f}), worst 1-s window {worst}"
    )
    assert worst <= rate + burst, f"{worst} starts in one second (limit {rate} + burst {burst})"
    assert len(in_run) >= MIN_RATE_SHARE * expected, f"{len(in_run)} starts in {RATE_SECONDS}s"
    assert len(in_run) <= 1.05 * expected + burst, f"{len(in_run)} starts in {RATE_SECONDS}s"
    gap = longest_gap(in_run)
    assert gap <= STALL_SECONDS, f"no start for {gap:.2f}s while jobs waited"


def test_limit_by_runs_two_of_each_partition_and_never_three_of_one(workers, tmp_path):
    ledger = tmp_path / "ledger"
    start_three(workers, ledger)
    calls = [((), {"customer": c, "n": i}) for i in range(10) for c in ("acme", "globex")]
    ids = [int(r.id) for r in shardq.enqueue_many(limit_tasks.two_per_customer, calls)]
    wait_until(lambda: finished(ids), timeout=60, message="20 partitioned jobs finished")
    rows = read_ledger(ledger)
    for part in ("acme", "globex"):
        assert max(n for _, n in running_profile(rows, part)) == 2, f"{part} did not run exactly 2 at once"
    assert max(n for _, n in running_profile(rows)) == 4, "the two partitions never ran 2 + 2 at once"


def test_a_sigkilled_workers_slots_come_back_within_ttl_and_a_heartbeat(workers, tmp_path):
    ledger = tmp_path / "ledger"
    env = {"SHARDQ_LIMIT_LEDGER": str(ledger)}
    a = workers.start("--concurrency", "8", env=env)
    a_id = worker_id_of(a.pid)
    shardq.enqueue_many(limit_tasks.three_at_once, [((i,), {"sleep": 60.0}) for i in range(4)])
    held = "SELECT count(*) FROM shardq_limit_slot WHERE worker_id = %s AND expires_at > clock_timestamp()"
    wait_until(lambda: scalar(held, [a_id]) == 3, message="A holds the 3 slots")
    os.killpg(a.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: scalar(held, [a_id]) == 0, timeout=TTL + HEARTBEAT + 10, interval=0.02)
    back = time.monotonic() - killed
    print(f"[limits] SIGKILL: slots back after {back:.2f}s (TTL {TTL}s + heartbeat {HEARTBEAT}s)")
    assert back <= TTL + HEARTBEAT + 0.3, f"slots came back after {back:.2f}s"
    # And another worker really takes them: the rescued jobs run there.
    b = workers.start("--concurrency", "8", env=env)
    b_id = worker_id_of(b.pid)
    wait_until(lambda: scalar(held, [b_id]) == 3, timeout=TTL * 3 + 10, message="B takes the 3 slots")
    owned = "SELECT count(*) FROM shardq_limit_slot WHERE worker_id IS NOT NULL AND expires_at > clock_timestamp()"
    assert scalar(owned) == 3


def test_jobs_held_back_by_a_limit_keep_their_place_and_do_not_block_their_shard(workers, tmp_path):
    ledger = tmp_path / "ledger"
    workers.start("--concurrency", "8", env={"SHARDQ_LIMIT_LEDGER": str(ledger)})
    # One shard: 30 jobs of a task limited to 3 at once, then an unlimited
    # job and another limited task's jobs, all behind them in claim order.
    held = [
        int(r.id)
        for r in shardq.enqueue_many(
            limit_tasks.three_at_once.using(shard_key="one"), [((i, 0.5), {}) for i in range(30)]
        )
    ]
    later = limit_tasks.unlimited_sleep.using(shard_key="one").enqueue(sleep=0.0)
    other = [int(limit_tasks.two_per_customer.using(shard_key="one").enqueue(customer="c").id) for _ in range(2)]
    wait_until(lambda: finished([int(later.id), *other]), timeout=5, message="the jobs behind the limited backlog")
    rows = read_ledger(ledger)
    started = [job for event, job, *_ in rows if event == "start" and job in held]
    assert len(started) < 30  # the backlog was still waiting
    assert scalar("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'READY'", [held]) > 0
    assert sorted(started[:3]) == held[:3]  # the oldest ran first
    wait_until(lambda: finished(held), timeout=60)
    started = [job for event, job, *_ in read_ledger(ledger) if event == "start" and job in held]
    # Held back, not reordered: each start is among the three oldest not yet started.
    for i, job in enumerate(started):
        assert job in sorted(set(held) - set(started[:i]))[:3], f"job {job} overtook older jobs"
    limited = [r for r in read_ledger(ledger) if r[1] in held]
    assert max(n for _, n in running_profile(limited)) == 3


def test_a_queue_limit_holds_at_run_time_across_three_workers(workers, tmp_path, settings):
    """SHARDQ["QUEUES"] = {"emails": {"max_concurrency": 20, "rate_limit": "50/s"}}
    in the workers and at enqueue: 24 threads, tasks of the queue sleeping
    0.5 s (the rate alone would let 25 run at once), so the cap of 20 is
    what holds them, and the rate what spaces their starts."""
    queues = {"emails": {"max_concurrency": 20, "rate_limit": "50/s"}}
    settings.SHARDQ = {**settings.SHARDQ, "QUEUES": queues}
    ledger = tmp_path / "ledger"
    start_three(workers, ledger, SHARDQ_TEST_QUEUES=json.dumps(queues))
    ids = [int(r.id) for r in shardq.enqueue_many(limit_tasks.email_sleep, [((i,), {}) for i in range(120)])]
    wait_until(lambda: finished(ids), timeout=60, message="120 jobs of the limited queue finished")
    rows = read_ledger(ledger)
    starts = sorted(r[2] for r in rows if r[0] == "start")
    assert len(starts) == 120
    profile = running_profile(rows)
    peak = max(running for _, running in profile)
    worst = max(sum(1 for u in starts if t <= u < t + 1.0) for t in starts)
    burst = parse_rate("50/s").burst
    print(f"[limits] queue emails (20 at once, 50/s): peak {peak} running, worst 1-s window {worst} starts")
    # Reached and never passed: the cap, not the threads or the rate, held them.
    assert peak == 20, f"{peak} jobs of the queue ran at once (cap 20)"
    assert worst <= 50 + burst, f"{worst} starts in one second (rate 50/s + burst {burst})"
