"""The fault suite's harness: sizes, fault injectors, figures and the invariants.

Every fault test runs real ``shardq_worker`` processes against real
PostgreSQL, injects one kind of fault, lets the jobs drain, then calls
``check_invariants`` — the guarantees of DESIGN §8, checked in SQL:

(a) every job enqueued ends SUCCESSFUL or dead-lettered (FAILED with its
    attempts used up, or as WorkerLost with its worker-loss budget used up:
    SHARDQ["MAX_WORKER_LOSSES"] interrupted attempts — under SIGKILL churn a
    rescued job is often mid-run again at the next kill), none is lost and
    none is left READY or RUNNING;
(b) the ledger (written in the same transaction as the job's fenced
    completion) has exactly one row per SUCCESSFUL ledger job, none for a
    dead-lettered one, and that row carries the job's final attempt and fence;
(c) every extra execution (execution log, written before the work over its
    own autocommit connection) matches a counted rescue or retry: no claim is
    executed twice, and per job the re-starts are exactly its retries (errors
    recorded) plus its worker losses (rescues of a started attempt), which the
    shard history's rescued count covers;
(d) per shard, the history's claim_version strictly rises with every claim or
    takeover, a release gives back the version its worker claimed, and the
    shard row holds the newest version;
(e) no committed outcome carries a fence older than its shard's version at
    COMMIT (the completion locks the shard row and returns its version).
"""

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator

import psutil

from shardq.conf import get_config
from tests.helpers import wait_until

FULL = os.environ.get("SHARDQ_FULL_FAULTS") == "1"

# The worker settings of tests/workers.py FAST_LEASES.
TTL = 2.0
HEARTBEAT = 0.4
POLL = 0.2

LEDGER_TASK = "tests.taskapp.fault_tasks.tx_ledger"
ACKED_TASK = "tests.taskapp.fault_tasks.acked"

Query = Callable[..., list]


def size(ci, full):
    """The CI size, or the full one under SHARDQ_FULL_FAULTS=1 (`make faults`)."""
    return full if FULL else ci


def percentile(values, p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def figures(name: str, **values) -> None:
    """Print one line of measured figures (pytest -s, or the captured output)."""
    text = ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"[faults] {name}: {text}")
    path = os.environ.get("SHARDQ_FAULTS_FIGURES")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"test": name, **values}, default=str) + "\n")


def all_stats(query: Query) -> list[dict]:
    rows = query("SELECT stats FROM shardq_worker")
    return [json.loads(s) if isinstance(s, str) else (s or {}) for (s,) in rows]


def counter_totals(query: Query) -> dict[str, int]:
    totals: dict[str, int] = {}
    for stats in all_stats(query):
        for name, value in stats.items():
            totals[name] = totals.get(name, 0) + int(value)
    return totals


# -- the invariants -----------------------------------------------------------


def check_invariants(
    query: Query, expected_jobs: int, shard_count: int = 64, lost_starts: frozenset[int] = frozenset()
) -> dict:
    """Assert (a)–(e) over the whole database; return the figures of the run.

    ``lost_starts``: the jobs a worker reported its start write lost for
    (a failover: start writes commit asynchronously, docs/architecture.md);
    each may have run its attempt once more under the same attempt number
    and fence, and only those."""
    problems: list[str] = []

    # (a) nothing lost, everything terminal.
    total = query("SELECT count(*) FROM shardq_job")[0][0]
    if total != expected_jobs:
        problems.append(f"(a) {expected_jobs} jobs enqueued, {total} in the table")
    open_jobs = query(
        "SELECT id, status, attempts, max_attempts FROM shardq_job "
        "WHERE NOT (status = 'SUCCESSFUL' OR (status = 'FAILED' AND attempts >= max_attempts) "
        "OR (status = 'FAILED' AND worker_losses >= %s AND errors::text LIKE '%%shardq.exceptions.WorkerLost%%')) "
        "ORDER BY id LIMIT 20",
        [get_config().max_worker_losses],
    )
    if open_jobs:
        problems.append(f"(a) jobs neither SUCCESSFUL nor dead-lettered: {open_jobs}")

    # (b) one ledger row per committed ledger job, matching its final claim.
    bad_ledger = query(
        "SELECT j.id, j.status, count(l.id), array_agg(l.worker) FROM shardq_job j "
        "LEFT JOIN taskapp_faultledger l ON l.job_id = j.id "
        "WHERE j.task_path = %s GROUP BY j.id, j.status "
        "HAVING count(l.id) <> CASE WHEN j.status = 'SUCCESSFUL' THEN 1 ELSE 0 END "
        "ORDER BY j.id LIMIT 20",
        [LEDGER_TASK],
    )
    if bad_ledger:
        problems.append(f"(b) ledger rows per job wrong (id, status, rows, workers): {bad_ledger}")
    stray = query(
        "SELECT l.job_id, l.attempt, l.fence, j.attempts, j.fence FROM taskapp_faultledger l "
        "JOIN shardq_job j ON j.id = l.job_id "
        "WHERE l.attempt <> j.attempts OR l.fence <> j.fence OR l.worker <> j.worker_ids->>-1 LIMIT 20"
    )
    if stray:
        problems.append(f"(b) ledger rows of a claim that is not the committed one: {stray}")
    double_commits = query(
        "SELECT count(*) FROM (SELECT job_id FROM taskapp_faultledger GROUP BY 1 HAVING count(*) > 1) d"
    )[0][0]

    # (c) executions: each claim at most once; extra executions explained.
    twice = [
        (job_id, attempt, fence, n)
        for job_id, attempt, fence, n in query(
            "SELECT job_id, attempt, fence, count(*) FROM taskapp_execution GROUP BY 1, 2, 3 HAVING count(*) > 1"
        )
        if not (job_id in lost_starts and n == 2)
    ][:20]
    if twice:
        problems.append(f"(c) one claim executed twice (job, attempt, fence, n): {twice}")
    beyond = query(
        "SELECT e.job_id, e.attempt, j.attempts FROM taskapp_execution e JOIN shardq_job j ON j.id = e.job_id "
        "WHERE e.attempt > j.attempts LIMIT 20"
    )
    if beyond:
        problems.append(f"(c) an execution of an attempt the job never reached: {beyond}")
    executions, extra = query(
        "SELECT coalesce(sum(n), 0), coalesce(sum(greatest(n - 1, 0)), 0) "
        "FROM (SELECT job_id, count(*) AS n FROM taskapp_execution GROUP BY 1) e"
    )[0]
    # Per job: attempts - 1 re-claims, each after a retry (an error recorded
    # while the job went on) or a rescue; a dead-lettered job's last error is
    # its final failure, a WorkerLost one a rescue of its own.
    retries, rescues_needed = query(
        "SELECT coalesce(sum(retries), 0), coalesce(sum(attempts - 1 - retries + lost), 0) FROM ("
        "  SELECT attempts, jsonb_array_length(errors) - CASE WHEN status = 'FAILED' THEN 1 ELSE 0 END AS retries,"
        "         CASE WHEN status = 'FAILED' AND errors->-1->>'exception_class_path' = 'shardq.exceptions.WorkerLost'"
        "              THEN 1 ELSE 0 END AS lost"
        "  FROM shardq_job WHERE attempts > 0) j"
    )[0]
    rescued = query("SELECT coalesce(sum(rescued), 0) FROM shardq_shard_event")[0][0]
    # A rescue of a started attempt is a worker loss, counted on the job; the
    # shard history also counts claimed-but-unstarted jobs put back for free.
    losses = query("SELECT coalesce(sum(worker_losses), 0) FROM shardq_job")[0][0]
    if rescues_needed != losses:
        problems.append(
            f"(c) the jobs' attempts need {rescues_needed} rescues of started attempts, "
            f"the jobs counted {losses} worker losses"
        )
    if losses > rescued:
        problems.append(f"(c) {losses} worker losses, the shard history counted only {rescued} rescues")
    if extra > rescued + retries + len(lost_starts):
        problems.append(
            f"(c) {extra} extra executions, only {rescued} rescues + {retries} retries "
            f"+ {len(lost_starts)} lost start writes to explain them"
        )

    # (d) claim versions only rise.
    falling = query(
        "SELECT shard, id, reason, claim_version, prev_version FROM ("
        "  SELECT shard, id, reason, claim_version,"
        "         max(claim_version) OVER (PARTITION BY shard ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_version"
        "  FROM shardq_shard_event) e "
        "WHERE (reason <> 'release' AND claim_version <= coalesce(prev_version, 0))"
        "   OR (reason = 'release' AND claim_version <> prev_version) LIMIT 20"
    )
    if falling:
        problems.append(f"(d) claim_version did not rise (shard, event, reason, version, previous): {falling}")
    releases_not_own = query(
        "SELECT r.shard, r.claim_version FROM shardq_shard_event r WHERE r.reason = 'release' AND NOT EXISTS ("
        "  SELECT 1 FROM shardq_shard_event c WHERE c.shard = r.shard AND c.claim_version = r.claim_version"
        "  AND c.reason <> 'release' AND c.worker = r.worker) LIMIT 20"
    )
    if releases_not_own:
        problems.append(f"(d) a release of a version its worker never claimed: {releases_not_own}")
    behind = query(
        "SELECT s.shard, s.claim_version, max(e.claim_version) FROM shardq_shard s "
        "JOIN shardq_shard_event e ON e.shard = s.shard GROUP BY 1, 2 HAVING s.claim_version <> max(e.claim_version) LIMIT 20"
    )
    if behind:
        problems.append(f"(d) shard rows not at their newest version: {behind}")
    shards = query("SELECT count(*) FROM shardq_shard WHERE shard < %s", [shard_count])[0][0]
    if shards != shard_count:
        problems.append(f"(d) {shards} shard rows, expected {shard_count}")

    # (e) committed outcomes carry the shard's version at COMMIT.
    stale = query("SELECT job_id, fence, shard_version FROM taskapp_faultledger WHERE fence < shard_version LIMIT 20")
    if stale:
        problems.append(f"(e) outcomes committed under a stale fence (job, fence, shard version): {stale}")
    ahead = query(
        "SELECT j.id, j.fence, s.claim_version FROM shardq_job j JOIN shardq_shard s ON s.shard = j.shard "
        "WHERE j.fence > s.claim_version LIMIT 20"
    )
    if ahead:
        problems.append(f"(e) a job fenced by a version its shard never had: {ahead}")

    counters = counter_totals(query)
    statuses = dict(query("SELECT status, count(*) FROM shardq_job GROUP BY 1"))
    report = {
        "jobs": total,
        "statuses": statuses,
        "executions": int(executions),
        "extra_executions": int(extra),
        "rescued": int(rescued),
        "retries": int(retries),
        "double_commits": int(double_commits),
        "lost": max(0, expected_jobs - total),
        "dead_lettered_by_losses": query(
            "SELECT count(*) FROM shardq_job WHERE status = 'FAILED' AND worker_losses >= %s",
            [get_config().max_worker_losses],
        )[0][0],
        "fence_rejections": counters.get("fence_rejections", 0),
        "self_fences": counters.get("self_fences", 0),
        "takeovers": counters.get("takeovers", 0),
        "releases": counters.get("releases", 0),
        "reexecutions": counters.get("reexecutions", 0),
    }
    assert not problems, "invariants violated:\n  " + "\n  ".join(problems) + f"\nfigures: {report}"
    return report


# -- enqueue and wait -----------------------------------------------------------


def insert_jobs(
    query: Query,
    task_path: str,
    count: int,
    *,
    kwargs_sql: str = "jsonb_build_object('n', g)",
    args_sql: str = "'[]'::jsonb",
    max_attempts: int = 10,
    shard_count: int = 64,
) -> None:
    """Insert READY jobs directly (one statement), spread over every shard, and
    NOTIFY their shards — what enqueue_many writes, for a server the test's
    Django connection is not on."""
    query(
        "WITH j AS (INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, "
        "ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at) "
        f"SELECT %s, 'default', 'default', 0, clock_timestamp(), g %% %s, g, false, 'READY', 0, 0, 0, %s, "
        f"{args_sql}, {kwargs_sql}, '[]', '[]', clock_timestamp() FROM generate_series(1, %s) AS g RETURNING shard) "
        "SELECT count(pg_notify('shardq', s::text)) FROM (SELECT DISTINCT shard AS s FROM j) d",
        [task_path, shard_count, max_attempts, count],
    )


def finished(query: Query) -> int:
    return query("SELECT count(*) FROM shardq_job WHERE status IN ('SUCCESSFUL', 'FAILED')")[0][0]


def wait_all_finished(query: Query, total: int, timeout: float) -> None:
    wait_until(
        lambda: (
            finished(query) >= total
            and not query("SELECT 1 FROM shardq_job WHERE status NOT IN ('SUCCESSFUL', 'FAILED') LIMIT 1")
        ),
        timeout=timeout,
        interval=0.25,
        message=f"{total} jobs to finish (now {dict(query('SELECT status, count(*) FROM shardq_job GROUP BY 1'))})",
    )


# -- fault injectors -------------------------------------------------------------


def live_children(supervisor, query: Query) -> dict[int, str]:
    """pid -> incarnation id of the supervisor's children that hold shards."""
    pids = [p.pid for p in psutil.Process(supervisor.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
    if not pids:
        return {}
    rows = query(
        "SELECT w.pid, w.id::text FROM shardq_worker w WHERE w.pid = ANY(%s) AND w.state = 'RUNNING' "
        "AND EXISTS (SELECT 1 FROM shardq_shard s WHERE s.owner = w.id AND s.lease_expires > clock_timestamp())",
        [pids],
    )
    return dict(rows)


def churn_victims(supervisor, query: Query, rng: random.Random, seconds: float, every: float) -> Iterator[tuple]:
    """SIGKILL churn's pace: while jobs remain (for at most ``seconds``), every
    ``every`` seconds pick one of the supervisor's children that hold shards,
    never the last one (nobody would be left to take over), and yield its
    (pid, worker id) for the caller to kill; the caller's work after the kill
    counts inside the period."""
    started = time.monotonic()
    while time.monotonic() - started < seconds and query(
        "SELECT 1 FROM shardq_job WHERE status NOT IN ('SUCCESSFUL', 'FAILED') LIMIT 1"
    ):
        picked_at = time.monotonic()
        children = wait_until(
            lambda: len(c := live_children(supervisor, query)) >= 2 and c,
            timeout=60,
            message="two children holding shards",
        )
        yield rng.choice(sorted(children.items()))
        pause = picked_at + every - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the kills: one every ``every`` seconds at most


def lost_to_survivors(query: Query, killed: set[str]) -> list:
    """WorkerLost dead letters with an attempt on a worker that was never
    killed: under SIGKILL churn a job may honestly lose its worker-loss budget
    (rescued, started by the next owner just as that one is killed), but only
    to workers that died: every attempt of it ran on a killed worker (the
    churn tests' tasks never raise, so no attempt ended otherwise). Returns
    (id, worker_ids) of the others (should be none)."""
    rows = query(
        "SELECT id, worker_ids FROM shardq_job WHERE status = 'FAILED' "
        "AND errors::text LIKE '%%shardq.exceptions.WorkerLost%%' ORDER BY id"
    )
    return [
        (job, workers)
        for job, workers in rows
        if not set(json.loads(workers) if isinstance(workers, str) else workers) <= killed
    ]


class Repeating(threading.Thread):
    """Run ``action`` every ``every_seconds`` (the pace of a fault) until stopped."""

    def __init__(self, action, every_seconds: float, name: str):
        super().__init__(name=name, daemon=True)
        self.action = action
        self.every = every_seconds
        self.halt = threading.Event()
        self.errors: list[BaseException] = []
        self.count = 0

    def run(self) -> None:
        while not self.halt.wait(self.every):  # pacing the fault, not waiting for a condition
            try:
                if self.action():
                    self.count += 1
            except Exception as exc:  # reported by the test after stop()
                self.errors.append(exc)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)
        assert not self.errors, f"{self.name} failed: {self.errors[:3]}"


class BackendKiller:
    """``pg_terminate_backend`` on one random connection whose application_name
    matches, over its own autocommit connection."""

    def __init__(self, conn, pattern: str = "shardq%", exclude: tuple = ()):
        self.conn = conn
        self.pattern = pattern
        self.exclude = exclude
        self.killed: dict[str, int] = {}
        self.rng = random.Random(5)

    def __call__(self) -> bool:
        rows = self.conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE %s AND pid <> pg_backend_pid()",
            [self.pattern],
        ).fetchall()
        rows = [r for r in rows if r[1] not in self.exclude]
        if not rows:
            return False
        pid, name = self.rng.choice(rows)
        if self.conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]:
            self.killed[name] = self.killed.get(name, 0) + 1
            return True
        return False
