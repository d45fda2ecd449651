"""A limit partitioned by the shard key, kept in the owner's local queue
(docs/limits.md; ``key_limited`` rows, no slot table), across real workers.

``two_per_key`` (tests/taskapp/limit_tasks.py) has ``key="customer",
max_concurrency=2, limit_by="customer"``: each run appends its start and end
(job id, time, pid, customer) to a ledger file, and the cap is checked on
the ledger's intervals, not on shardq's own bookkeeping. A SIGKILLed
worker's jobs never write their end: such a run counts as running until the
kill.
"""

import json
import os
import re
import signal
import time
from collections import Counter, defaultdict
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

import shardq
from shardq.limits import limit_report
from tests.acceptance.test_limits import start_three
from tests.helpers import wait_until
from tests.taskapp import limit_tasks
from tests.workers import WorkerPool, query, scalar, worker_id_of

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 2
TASK = limit_tasks.two_per_key
KEY_PREFIX = f"t:{TASK.module_path}="


@pytest.fixture
def workers(tmp_path):
    pool = WorkerPool(tmp_path)
    yield pool
    pool.stop_all()


# -- the ledger -------------------------------------------------------------


def runs(ledger: Path, killed: dict[int, float] | None = None) -> list[tuple[float, float, int, int, str]]:
    """Every run as (start, end, job id, pid, customer). A start with no end
    is a run of a killed worker (``killed``: pid -> kill time): it counts as
    running until the kill; one of a live worker fails the test."""
    killed = killed or {}
    open_runs: dict[tuple[int, int], tuple[float, str]] = {}
    out = []
    for line in ledger.read_text().splitlines():
        event, job, at, pid, *part = line.split()
        attempt = (int(job), int(pid))
        if event == "start":
            assert attempt not in open_runs, f"job {job} started twice on pid {pid} without an end"
            open_runs[attempt] = (float(at), part[0] if part else "")
        else:
            began, customer = open_runs.pop(attempt)
            out.append((began, float(at), attempt[0], attempt[1], customer))
    for (job, pid), (began, customer) in open_runs.items():
        assert pid in killed, f"job {job} started on live pid {pid} and never ended"
        out.append((began, killed[pid], job, pid, customer))
    return sorted(out)


def peak(spans) -> int:
    """Most runs at once (an end and a start at one instant do not overlap)."""
    events = sorted([(s, 1) for s, *_ in spans] + [(e, -1) for _, e, *_ in spans])
    running = top = 0
    for _, step in events:
        running += step
        top = max(top, running)
    return top


def peaks_by_customer(spans) -> dict[str, int]:
    by = defaultdict(list)
    for span in spans:
        by[span[4]].append(span)
    return {customer: peak(mine) for customer, mine in by.items()}


def enqueue(keys: list[str], per_key: int, **kwargs) -> list[int]:
    """``per_key`` jobs of each key, interleaved, in one transaction (every
    pool holding the shards is woken by the one commit)."""
    calls = [((), {"customer": k, "n": n, **kwargs}) for n in range(per_key) for k in keys]
    return [int(r.id) for r in shardq.enqueue_many(TASK, calls)]


def finished(ids: list[int]) -> bool:
    return scalar("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [ids]) == len(ids)


def held_by(pool: str) -> int:
    return scalar(
        "SELECT count(*) FROM shardq_shard WHERE pool = %s AND owner IS NOT NULL AND lease_expires > clock_timestamp()",
        [pool],
    )


def shards_of(owner: str) -> int:
    return scalar(
        "SELECT count(*) FROM shardq_shard WHERE owner = %s AND lease_expires > clock_timestamp()",
        [owner],
    )


# -- the tests ----------------------------------------------------------------


def test_two_per_key_holds_across_three_workers_and_keys_run_side_by_side(workers, tmp_path):
    ledger = tmp_path / "ledger"
    start_three(workers, ledger)
    keys = [f"cust-{i}" for i in range(6)]
    ids = enqueue(keys, 10)
    # Kept out of the slot table: the ordinary claim takes them.
    rows = query("SELECT key_limited, limit_keys FROM shardq_job WHERE id = ANY(%s)", [ids])
    assert rows == [(True, None)] * len(ids)
    wait_until(lambda: finished(ids), timeout=60, message="60 key-limited jobs finished")

    spans = runs(ledger)
    assert len(spans) == len(ids) and {s[2] for s in spans} == set(ids), "each job ran exactly once"
    peaks = peaks_by_customer(spans)
    total = peak(spans)
    pids = {s[3] for s in spans}
    print(f"[key limits] three workers: peaks {peaks}, {total} running at most, {len(pids)} workers ran jobs")
    assert peaks == dict.fromkeys(keys, CAP), "a key ran more than 2 at once, or never 2"
    assert total > CAP, "the keys never ran side by side"
    # No slot was taken, owned or even created for them.
    assert scalar("SELECT count(*) FROM shardq_limit_slot") == 0
    assert scalar("SELECT count(*) FROM shardq_limit_rate") == 0


def test_two_pools_holding_one_shard_never_run_three_of_a_key(workers, tmp_path):
    ledger = tmp_path / "ledger"
    env = {"SHARDQ_LIMIT_LEDGER": str(ledger)}
    # A small look-ahead: a worker that buffers 512 jobs takes the first job
    # of every key in its first claim and then holds every key (the other
    # pool's claims are held back by the guard): only one pool would run.
    named = workers.start("--queues", "default", "--concurrency", "4", "--prefetch", "2", env=env)
    every = workers.start("--concurrency", "4", "--prefetch", "2", env=env)  # pool "*": every queue
    ids_by_proc = {worker_id_of(named.pid): "default", worker_id_of(every.pid): "*"}
    wait_until(
        lambda: held_by("default") == 64 and held_by("*") == 64,
        timeout=60,
        message="each pool to hold every shard",
    )
    keys = [f"cust-{i}" for i in range(8)]
    ids = enqueue(keys, 8)
    wait_until(lambda: finished(ids), timeout=60, message="64 key-limited jobs finished")

    spans = runs(ledger)
    assert len(spans) == len(ids) and {s[2] for s in spans} == set(ids), "each job ran exactly once"
    peaks = peaks_by_customer(spans)
    ran_by = Counter(
        ids_by_proc[w] for (w,) in query("SELECT worker_ids->>0 FROM shardq_job WHERE id = ANY(%s)", [ids])
    )
    pool_of_pid = {named.pid: "default", every.pid: "*"}
    pools_of_key = defaultdict(set)
    for span in spans:
        pools_of_key[span[4]].add(pool_of_pid[span[3]])
    both = sorted(k for k, pools in pools_of_key.items() if len(pools) == 2)
    print(
        f"[key limits] two pools: peaks {peaks}, {peak(spans)} running at most, jobs by pool {dict(ran_by)}, "
        f"keys run by both pools {both}"
    )
    assert max(peaks.values()) <= CAP, f"a key ran more than {CAP} at once across the pools: {peaks}"
    assert set(ran_by) == {"default", "*"}, f"both pools ran jobs: {dict(ran_by)}"


def test_a_retried_job_is_not_run_by_the_other_pool_beside_two_newer_jobs_of_its_key(workers, tmp_path):
    """A job that failed is READY again (its retry delay later) with an id
    below the newer jobs of its key, which its pool meanwhile runs 2 at once.
    The other pool holds the shard too: it must not claim the retry while the
    key has jobs in flight under the first pool's lease (the claim_jobs guard
    once looked only at a job's earlier ids, and the retry ran as a third)."""
    ledger = tmp_path / "ledger"
    env = {"SHARDQ_LIMIT_LEDGER": str(ledger)}
    named = workers.start("--queues", "default", "--concurrency", "8", env=env)
    every = workers.start("--concurrency", "8", env=env)
    wait_until(lambda: held_by("default") == 64 and held_by("*") == 64, timeout=60, message="both pools")
    keys = ["acme", "globex"]
    # Per key: the first job fails at once and is due again 0.5 s later (the
    # other pool may claim it earlier still: the claim looks 0.5 s ahead);
    # jobs of 1 s follow, so the key runs 2 at once when the retry is due.
    calls = [((), {"customer": k, "n": n, "fail": n == 0, "sleep": 1.0}) for n in range(5) for k in keys]
    ids = [int(r.id) for r in shardq.enqueue_many(limit_tasks.two_per_key_retried, calls)]
    wait_until(lambda: finished(ids), timeout=30, message="10 key-limited jobs finished")

    spans = runs(ledger)
    assert Counter(s[2] for s in spans) == Counter(ids) + Counter(ids[: len(keys)]), "the first jobs ran twice"
    pool_of = {named.pid: "default", every.pid: "*"}
    retried = [(s[4], pool_of[s[3]]) for s in spans if s[2] in ids[: len(keys)]]
    peaks = peaks_by_customer(spans)
    print(f"[key limits] retry across pools: peaks {peaks}; first jobs' attempts ran on {retried}")
    assert max(peaks.values()) <= CAP, f"a key ran more than {CAP} at once across the pools: {peaks}"


def test_a_sigkilled_workers_key_limited_jobs_finish_elsewhere_and_the_cap_holds(workers, tmp_path):
    ledger = tmp_path / "ledger"
    env = {"SHARDQ_LIMIT_LEDGER": str(ledger), "SHARDQ_EXPECTED_WORKERS": "2"}
    a = workers.start("--concurrency", "8", env=env)
    b = workers.start("--concurrency", "8", env=env)
    a_id, b_id = worker_id_of(a.pid), worker_id_of(b.pid)
    wait_until(lambda: shards_of(a_id) == 32 and shards_of(b_id) == 32, timeout=60, message="32 shards each")
    keys = [f"cust-{i}" for i in range(8)]
    ids = enqueue(keys, 6, sleep=0.5)

    def a_running() -> bool:
        starts = ends = 0
        for line in ledger.read_text().splitlines() if ledger.exists() else ():
            event, _, _, pid, _ = line.split()
            if int(pid) == a.pid:
                starts += event == "start"
                ends += event == "end"
        return starts - ends >= 2

    wait_until(a_running, timeout=10, interval=0.01, message="A running key-limited jobs")
    killed_at = time.time()
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(timeout=10)
    wait_until(lambda: finished(ids), timeout=30, message="every job finished, A's on B")

    spans = runs(ledger, killed={a.pid: killed_at})
    cut = sorted(s[2] for s in spans if s[3] == a.pid and s[1] == killed_at)
    assert cut, "A was killed while running jobs"
    rows = query("SELECT id, worker_ids, worker_losses FROM shardq_job WHERE id = ANY(%s) ORDER BY id", [cut])
    for job, worker_ids, losses in rows:
        worker_ids = json.loads(worker_ids) if isinstance(worker_ids, str) else worker_ids
        assert worker_ids[0] == a_id and worker_ids[-1] == b_id and losses >= 1, (job, worker_ids, losses)
    # Every job ran to its end exactly once (the cut ones again, on B).
    ended = Counter(s[2] for s in spans if s[1] != killed_at)
    assert ended == Counter(ids)
    peaks = peaks_by_customer(spans)
    print(f"[key limits] SIGKILL: {len(cut)} jobs cut on A and rescued on B; peaks {peaks}")
    assert max(peaks.values()) <= CAP, f"a key ran more than {CAP} at once around the kill: {peaks}"
    assert {s[3] for s in spans if s[1] != killed_at} >= {b.pid}


def test_shardq_status_shows_a_limit_by_the_shard_key_its_running_jobs_and_their_worker(workers, tmp_path):
    ledger = tmp_path / "ledger"
    proc = workers.start("--concurrency", "8", env={"SHARDQ_LIMIT_LEDGER": str(ledger)})
    worker = worker_id_of(proc.pid)
    ids = enqueue(["acme"], 6, sleep=1.0)
    key = KEY_PREFIX + "acme"

    def mine():
        return next((lim for lim in limit_report() if lim["key"] == key), None)

    seen = []

    def two_running():
        lim = mine()
        seen.append(lim)
        return lim is not None and lim["in_use"] >= CAP and lim

    lim = wait_until(two_running, timeout=10, interval=0.02, message=lambda: f"2 running in {seen[-3:]}")
    assert lim["in_use"] == CAP, f"more than {CAP} running: {lim}"
    # Waiting: the key's jobs READY or CLAIMED (the other 4, fewer once some end).
    assert 2 <= lim["waiting"] <= 4, lim
    assert {**lim, "waiting": None} == {
        "key": key,
        "kind": "partition by shard key",
        "max_concurrency": CAP,
        "rate_limit": None,
        "burst": None,
        "in_use": CAP,
        "holders": {worker: CAP},
        "waiting": None,
        "tokens_now": None,
    }
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    [shown] = [x for x in json.loads(out.getvalue())["limits"] if x["key"] == key]
    assert shown["kind"] == "partition by shard key" and shown["max_concurrency"] == CAP
    assert shown["in_use"] <= CAP and set(shown["holders"]) == {worker}
    out = StringIO()
    call_command("shardq_status", stdout=out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith(f"limit {key} "))
    match = re.fullmatch(
        rf"limit {re.escape(key)} \(partition by shard key\): (\d)/2 running (\d) waiting(?: held by {worker} (\d))?",
        line,
    )
    print(f"[key limits] shardq_status: {line}")
    assert match, line
    assert int(match[1]) <= CAP and (match[3] or "0") == match[1], line

    # Sampled while the rest run: never more than 2 in use.
    def sampled_until_finished():
        lim = mine()
        assert lim is None or lim["in_use"] <= CAP, lim
        return finished(ids)

    wait_until(sampled_until_finished, timeout=30, message="the other 4 jobs to finish")
    assert max(peaks_by_customer(runs(ledger)).values()) == CAP
    # Done: nothing left to show.
    assert mine() is None
