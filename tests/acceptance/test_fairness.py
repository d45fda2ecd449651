"""Fair share inside a queue across real workers (issue 25, docs/fairness.md).

``shardq_worker`` processes run tenants' jobs (tests/taskapp/fair_tasks.py)
that append their start and end to a ledger file; shares and pickups are
read from the ledger's times, not from shardq's bookkeeping. CI-sized runs
of the issue's scenarios 1, 2, 4, 5 and 6; ``make fairness``
(bench/fairness.py) runs them at full size, with fairness off beside them.
The bounds here are looser than the issue's figures where a loaded 2-core
machine needs it; each test prints what it measured.
"""

import bisect
import json
import os
import time
from pathlib import Path

import pytest

import shardq
from tests.acceptance.test_limits import read_ledger
from tests.conftest import wait_until
from tests.taskapp import fair_tasks as t
from tests.workers import WorkerPool, query, worker_id_of

pytestmark = pytest.mark.django_db(transaction=True)

# make fairness: the sizes (A's 50,000 jobs and B's 30 s; 10 s windows).
FULL = bool(os.environ.get("SHARDQ_FAIRNESS_FULL"))
NOISY, QUIET = (50_000, 300) if FULL else (3000, 40)
WINDOW = 10.0 if FULL else 1.0
SCALE = 4 if FULL else 1


@pytest.fixture
def workers(tmp_path):
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()


def start(workers, ledger: Path, count: int, concurrency: int = 4):
    procs = [
        workers.start(
            "--concurrency",
            str(concurrency),
            env={"SHARDQ_LIMIT_LEDGER": str(ledger), "SHARDQ_EXPECTED_WORKERS": str(count)},
        )
        for _ in range(count)
    ]
    for proc in procs:
        worker_id_of(proc.pid)
    share = 64 // count
    wait_until(
        lambda: (
            sorted(
                n
                for (n,) in query(
                    "SELECT count(*) FROM shardq_shard WHERE pool = '*' AND owner IS NOT NULL "
                    "AND lease_expires > clock_timestamp() GROUP BY owner"
                )
            )
            in ([share] * count, sorted([share] * (count - 1) + [64 - share * (count - 1)]))
        ),
        message=f"{count} workers holding their shares",
    )
    return procs


def finished(ids) -> bool:
    [(n,)] = query("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [list(ids)])
    return n == len(ids)


def starts(ledger: Path) -> list[tuple[int, float, str]]:
    """(job id, start time, tenant) of every start, in time order."""
    return [(job, at, part) for event, job, at, _, part in read_ledger(ledger) if event == "start"]


def enqueued_at(ids) -> dict[int, float]:
    return dict(query("SELECT id, extract(epoch FROM enqueued_at)::float8 FROM shardq_job WHERE id = ANY(%s)", [ids]))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_a_quiet_tenant_is_picked_up_at_once_past_a_noisy_tenants_backlog(workers, tmp_path):
    """Scenario 1, CI size: A enqueues 3,000 jobs of 10 ms, then B one job
    every 100 ms for 4 s, on 2 workers of 4 threads."""
    ledger = tmp_path / "ledger"
    start(workers, ledger, 2)
    noisy = [int(r.id) for r in shardq.enqueue_many(t.tenant_job, [(("A",), {"n": i}) for i in range(NOISY)])]
    quiet = []
    began = time.monotonic()
    for i in range(QUIET):
        # The load's pace, not a wait for something: B's one job every 100 ms.
        time.sleep(max(0.0, began + 0.1 * i - time.monotonic()))
        quiet.append(int(t.tenant_job.enqueue("B", n=i).id))
    wait_until(lambda: finished(quiet), timeout=120, message="B's jobs finished")
    rows = starts(ledger)
    at = enqueued_at(quiet)
    pickups = [started - at[job] for job, started, part in rows if part == "B"]
    last_b = max(started for _, started, part in rows if part == "B")
    a_after = sum(1 for _, started, part in rows if part == "A" and started > last_b)
    # How many of A's jobs started while each B job waited: the order, which
    # the machine's load does not change (B's wait in seconds does).
    a_starts = sorted(started for _, started, part in rows if part == "A")
    b_started = {job: started for job, started, part in rows if part == "B"}
    overtaken = [bisect.bisect_left(a_starts, b_started[job]) - bisect.bisect_left(a_starts, at[job]) for job in quiet]
    print(
        f"[fairness] noisy neighbour: B pickup p99 {p99(pickups) * 1000:.0f} ms, max {max(pickups) * 1000:.0f} ms; "
        f"A starts while a B job waited: p99 {p99(overtaken)}, max {max(overtaken)}"
    )
    assert len(pickups) == QUIET
    # A's backlog outlasted B's run (else B never competed with it).
    assert a_after > 0 or not finished(noisy), "A's backlog ran out before B's last job"
    # FIFO starts A's whole backlog ahead of B's first job (thousands here).
    # Fair, a B job waits for the claim that brings it and A's jobs
    # already on the threads: a few claims' worth, at any load.
    assert p99(overtaken) <= NOISY // 10, sorted(overtaken)[-5:]
    if FULL:
        # The figure (docs/fairness.md records the full run); in CI
        # the wall time measures the machine's load as much as the order
        # (2.2 s at a load of 16 with the order above intact).
        assert p99(pickups) <= 0.1, sorted(pickups)[-5:]


def test_three_backlogged_tenants_with_weights_3_1_1_start_60_20_20_in_every_window(workers, tmp_path):
    """Scenario 2, CI size: jobs of 50 ms, 1-second windows after the first
    2 s, 2 workers of 4 threads."""
    ledger = tmp_path / "ledger"
    start(workers, ledger, 2)
    backlogs = [
        [int(r.id) for r in shardq.enqueue_many(task, [((tenant,), {"sleep": 0.05}) for _ in range(n)])]
        for task, tenant, n in (
            (t.tenant_job.using(fair_weight=3), "A", 900 * SCALE),
            (t.tenant_job, "B", 350 * SCALE),
            (t.tenant_job, "C", 350 * SCALE),
        )
    ]
    # Until one tenant's backlog runs out (the windows end at its last start).
    wait_until(
        lambda: any(finished(ids) for ids in backlogs), timeout=120 * SCALE, message="a tenant's backlog to run out"
    )
    rows = starts(ledger)
    first = rows[0][1]
    # Each worker is fair over its own shards: the windows end when a tenant
    # ran out on any worker (its last start there).
    ledger_rows = read_ledger(ledger)
    pids = {pid for _, _, _, pid, _ in ledger_rows}
    end = min(
        max(at for event, _, at, pid, part in ledger_rows if event == "start" and part == p and pid == w)
        for p in "ABC"
        for w in pids
    )
    shares = []
    window = first + 2.0
    while window + WINDOW <= end:
        counts = {p: sum(1 for _, at, part in rows if part == p and window <= at < window + WINDOW) for p in "ABC"}
        total = sum(counts.values())
        shares.append({p: counts[p] / total for p in "ABC"})
        window += WINDOW
    print(f"[fairness] weights 3:1:1 per {WINDOW:.0f} s window:", [{p: f"{s[p]:.0%}" for p in s} for s in shares])
    assert shares, "no whole window while all three were backlogged"
    # The figure is ±5 points in every window (make fairness). On a
    # loaded 2-core machine a 1-second window strays further (48/26/26 at a
    # load of 16: a late claim leaves a worker without A's jobs for a
    # moment), so in CI every window keeps the weights' order and the whole
    # run their shares within 8 points; FIFO would run A's 900 first.
    bound = 0.05 if FULL else 0.08
    for share in shares:
        if FULL:
            assert all(abs(share[p] - w) <= bound for p, w in zip("ABC", (0.6, 0.2, 0.2), strict=True)), share
        else:
            assert share["A"] > max(share["B"], share["C"]) and min(share["B"], share["C"]) > 0.05, share
    counts = {p: sum(1 for _, at, part in rows if part == p and first + 2.0 <= at < window) for p in "ABC"}
    overall = {p: counts[p] / sum(counts.values()) for p in "ABC"}
    assert all(abs(overall[p] - w) <= bound for p, w in zip("ABC", (0.6, 0.2, 0.2), strict=True)), overall


def worker_time(rows, tenant: str, since: float, until: float) -> float:
    """Seconds of the ledger's runs of ``tenant`` within [since, until)."""
    began: dict[int, float] = {}
    total = 0.0
    for event, job, at, _, part in rows:
        if part != tenant:
            continue
        if event == "start":
            began[job] = at
        elif job in began:
            total += max(0.0, min(at, until) - max(began.pop(job), since))
    return total


def test_fair_by_time_shares_worker_time_between_a_slow_and_a_fast_tenant(workers, tmp_path):
    """Scenario 4, CI size: A's jobs take 100 ms, B's 10 ms, both
    backlogged, equal weights, fair_by="time": each about half the time."""
    ledger = tmp_path / "ledger"
    start(workers, ledger, 2)
    slow = [
        int(r.id) for r in shardq.enqueue_many(t.tenant_timed, [(("A",), {"sleep": 0.1}) for _ in range(400 * SCALE)])
    ]
    fast = [
        int(r.id) for r in shardq.enqueue_many(t.tenant_timed, [(("B",), {"sleep": 0.01}) for _ in range(4000 * SCALE)])
    ]
    wait_until(lambda: len(starts(ledger)) > 0, timeout=30, message="jobs starting")
    wait_until(lambda: finished(slow) or finished(fast), timeout=120 * SCALE, message="a tenant's backlog to run out")
    rows = read_ledger(ledger)
    first = min(at for event, _, at, _, _ in rows if event == "start")
    end = min(max(at for event, _, at, _, part in rows if event == "start" and part == p) for p in "AB")
    since, until = first + 1.0, end
    a, b = worker_time(rows, "A", since, until), worker_time(rows, "B", since, until)
    print(
        f"[fairness] fair by time: A {a:.2f}s, B {b:.2f}s of worker time in {until - since:.1f}s: A {a / (a + b):.0%}"
    )
    assert until - since >= 2.0, "too short a run with both backlogged"
    # The figure is 45-55 % (make fairness). Measured 55-57 % at a
    # load of 12 on 2 cores and 66 % at 16: B's 10 ms jobs need ten claims'
    # worth of jobs for each of A's, and a claim that comes late leaves B
    # dry, when A takes the thread (docs/fairness.md). By count A would get
    # 10/11 of the time (91 %; unit test): CI's bound sits between the two.
    assert (0.45 <= a / (a + b) <= 0.55) if FULL else (0.4 <= a / (a + b) <= 0.7)


def test_a_priority_job_starts_at_once_and_an_ordered_key_keeps_its_order_under_fairness(workers, tmp_path):
    """Scenario 6: a priority-100 job past a fair backlog, and an ordered key's jobs in order."""
    ledger = tmp_path / "ledger"
    start(workers, ledger, 2)
    for tenant in ("A", "B"):
        shardq.enqueue_many(t.tenant_job, [((tenant,), {"sleep": 0.01}) for _ in range(1500)])
    ordered = [int(t.tenant_ordered.enqueue("C", "acct-1", n=i).id) for i in range(30)]
    wait_until(lambda: len(starts(ledger)) > 200, timeout=30, message="the fair backlog running")
    urgent = []
    for i in range(5):
        urgent.append(int(t.tenant_job.using(priority=100).enqueue("D", n=i).id))
        wait_until(lambda: finished(urgent), timeout=30, message="the priority job finished")
    wait_until(lambda: finished(ordered), timeout=60, message="the ordered jobs finished")
    rows = read_ledger(ledger)
    at = enqueued_at(urgent)
    pickups = [started - at[job] for event, job, started, _, _ in rows if event == "start" and job in at]
    print(f"[fairness] priority 100 past a fair backlog: pickups {[round(p * 1000) for p in pickups]} ms")
    # The figure is 50 ms (make fairness: docs/fairness.md records
    # the full run); CI's bound leaves room for a loaded 2-core machine
    # (measured 106 ms at a load of 16).
    assert max(pickups) <= (0.05 if FULL else 0.25), pickups
    runs = [(event, int(part.rsplit("/", 1)[1])) for event, _, _, _, part in rows if part.startswith("C/acct-1/")]
    assert runs == [(event, n) for n in range(30) for event in ("start", "end")], "the ordered key ran out of order"


@pytest.mark.process
def test_a_quiet_tenant_stays_served_across_a_sigkilled_worker_and_no_job_is_lost(workers, tmp_path):
    """Scenario 5, CI size: the noisy neighbour on 3 workers of 4 threads,
    one SIGKILLed halfway through B's run. Nothing is lost; a job runs to
    its end twice only when the killed worker ran it and died before writing
    its outcome (at-least-once, docs/architecture.md); B's jobs on the
    survivors' shards keep their pickups, those on the dead worker's shards
    wait for the takeover: dead-owner detection's, a fraction of a second
    (docs/reliability.md, "A worker that dies"), before the lease (2 s here)
    could have expired."""
    import signal

    ledger = tmp_path / "ledger"
    procs = start(workers, ledger, 3)
    victim = procs[1]
    victim_id = worker_id_of(victim.pid)
    # Twice scenario 1's at CI size: 3 workers drain faster than 2.
    backlog = NOISY if FULL else NOISY * 2
    noisy = [int(r.id) for r in shardq.enqueue_many(t.tenant_job, [(("A",), {"n": i}) for i in range(backlog)])]
    quiet: list[int] = []
    killed_at = 0.0
    dead_shards: set[int] = set()
    began = time.monotonic()
    for i in range(QUIET):
        # The load's pace, not a wait for something: B's one job every 100 ms.
        time.sleep(max(0.0, began + 0.1 * i - time.monotonic()))
        if i == QUIET // 2:
            dead_shards = {s for (s,) in query("SELECT shard FROM shardq_shard WHERE owner = %s", [victim_id])}
            killed_at = time.time()
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
        quiet.append(int(t.tenant_job.enqueue("B", n=i).id))
    wait_until(lambda: finished(quiet), timeout=120, message="B's jobs finished")
    wait_until(lambda: finished(noisy), timeout=300 * SCALE, message="A's backlog finished")

    rows = read_ledger(ledger)
    at = enqueued_at(quiet)
    shard_of = dict(query("SELECT id, shard FROM shardq_job WHERE id = ANY(%s)", [quiet]))
    first_start: dict[int, float] = {}
    for event, job, when, _, _ in rows:
        if event == "start" and job in at:
            first_start.setdefault(job, when)
    pickups = {job: first_start[job] - at[job] for job in quiet}
    # B's jobs the takeover held: enqueued after the kill on the dead worker's shards.
    held_up = [job for job in quiet if at[job] >= killed_at - 0.05 and shard_of[job] in dead_shards]
    served = [pickups[job] for job in quiet if job not in held_up]
    ends: dict[int, list[tuple[float, int]]] = {}
    for event, job, when, pid, _ in rows:
        if event == "end":
            ends.setdefault(job, []).append((when, pid))
    twice = {job: e for job, e in ends.items() if len(e) > 1}
    print(
        f"[fairness] across a SIGKILL (3 workers): B pickup p99 {p99(list(pickups.values())) * 1000:.0f} ms over all "
        f"{len(quiet)}, {p99(served) * 1000:.0f} ms without the {len(held_up)} enqueued on the dead worker's "
        f"{len(dead_shards)} shards after the kill (max {max((pickups[j] for j in held_up), default=0) * 1000:.0f} ms); "
        f"{len(twice)} jobs ran to their end twice (the dead worker's, outcome unwritten)"
    )
    # Nothing lost: every job SUCCESSFUL (finished() above) and run to its end.
    assert set(ends) == set(noisy) | set(quiet)
    # Run twice only as at-least-once allows: first on the killed worker,
    # in the moment before the kill, with its outcome unwritten (the row
    # names the killed worker first and counts the loss), then once more.
    rows_twice = query("SELECT id, worker_ids, worker_losses FROM shardq_job WHERE id = ANY(%s)", [list(twice)])
    for job, worker_ids, losses in rows_twice:
        worker_ids = json.loads(worker_ids) if isinstance(worker_ids, str) else worker_ids
        first, *rest = sorted(twice[job])
        assert len(rest) == 1 and first[1] == victim.pid and rest[0][1] != victim.pid, (job, twice[job])
        assert killed_at - 1.0 <= first[0] <= killed_at + 0.05, (job, first, killed_at)
        assert worker_ids[0] == victim_id and losses >= 1, (job, worker_ids, losses)
    # B on the survivors' shards: as in scenario 1 (the order, at any load).
    a_starts = sorted(when for event, _, when, _, part in rows if event == "start" and part == "A")
    overtaken = [
        bisect.bisect_left(a_starts, first_start[job]) - bisect.bisect_left(a_starts, at[job])
        for job in quiet
        if job not in held_up
    ]
    assert p99(overtaken) <= NOISY // 10, sorted(overtaken)[-5:]
    # The dead worker's shards were taken as a dead owner's: each one's first
    # takeover after the kill came before its last renewal (at most a
    # heartbeat, 0.4 s, before the kill) could expire. (Later takeovers
    # among the survivors happen under a heavy load with this 2 s lease.)
    [(taken, last_taken)] = query(
        "SELECT count(*), extract(epoch FROM max(first))::float8 FROM ("
        "  SELECT shard, min(at) AS first FROM shardq_shard_event"
        "  WHERE reason = 'takeover' AND shard = ANY(%s) AND at >= to_timestamp(%s) GROUP BY shard) AS t",
        [sorted(dead_shards), killed_at],
    )
    assert taken == len(dead_shards) and last_taken - killed_at < 2.0 - 0.4, (taken, last_taken - killed_at)
    # B on the dead worker's shards: picked up once they are taken over.
    assert all(pickups[job] <= 2.0 + 3.0 for job in held_up), sorted(pickups[j] for j in held_up)
    if FULL:
        assert p99(served) <= 0.25, sorted(served)[-5:]
