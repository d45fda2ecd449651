"""Issue 17 part 1: coordination at scale, measured.

Many ``shardq_worker`` processes (``--concurrency 1``, tasks that sleep,
HEARTBEAT 0.4 s and LEASE_TTL 2 s as tests/workers.py sets them) share 64
shards on a private PostgreSQL server that preloads pg_stat_statements. A
sampler reads every lease row every ~50 ms on its own connection (role
``observer``) and checks at every sample:

* no live lease belongs to a worker that is not alive (a killed worker's
  lease may only run out, within LEASE_TTL of the kill);
* while membership is stable: every shard is owned by exactly one live
  worker, and no shard changes owner or claim version;
* after each join and after the kill, once settled: shares within 1.

Workers join one at a time; each join settles (every shard live-owned, shares
within 1, the joiner holding its share) within 2 heartbeats of the joiner's
registration. At several sizes, a stable window counts the lease statements
(pg_stat_statements, the workers' role only) per worker per heartbeat: they
must not grow with the worker count. Then a quarter of the workers is
SIGKILLed: no survivor gains more than ceil(orphaned / survivors) + 1 shards.

CI size: 8 workers, windows of 6 s (20 s at full membership), 2 killed.
``make scale`` (SHARDQ_FULL_SCALE=1): 16 workers, 4 killed, a 5-minute window.
Figures go to docs/scaling.md.
"""

import math
import os
import re
import threading
import time
from dataclasses import dataclass, field

import psycopg
import pytest

from shardq.db.queries import QUERIES
from tests.conftest import wait_until
from tests.faults.harness import figures
from tests.scale.postgres import ScalePostgres
from tests.workers import FAST_LEASES, WorkerPool, kill_tree

FULL = os.environ.get("SHARDQ_FULL_SCALE") == "1"
WORKERS = 16 if FULL else 8
KILLED = WORKERS // 4
# Sizes at which the lease statements are counted, and each window's length.
SIZES = (WORKERS // 4, WORKERS // 2, WORKERS)
WINDOW_SECONDS = 6.0
STABLE_SECONDS = 300.0 if FULL else 20.0
SHARDS = 64
HEARTBEAT = float(FAST_LEASES["SHARDQ_HEARTBEAT"])
TTL = float(FAST_LEASES["SHARDQ_LEASE_TTL"])
TASK = "tests.taskapp.scale_tasks.nap"
NAP_SECONDS = 0.2
# The lease protocol's statements (shardq/worker/leaser.py and the store's
# claim_shards transaction), as named in shardq/db/sql/.
LEASE_STATEMENTS = ("heartbeat", "renew_leases", "rescue_jobs", "claim_shards", "log_shard_claims", "release_shards")


@dataclass
class Sample:
    at: float  # database clock, epoch seconds
    owners: dict[int, str | None]  # shard -> owner with a live lease, else None
    versions: dict[int, int]


@dataclass
class Membership:
    """What the test did to the workers, read by the sampler's checks."""

    alive: set[str] = field(default_factory=set)
    killed_at: dict[str, float] = field(default_factory=dict)  # worker id -> time.time() of its SIGKILL
    stable_since: Sample | None = None  # set: membership is stable, this is the ownership to keep


class Sampler(threading.Thread):
    def __init__(self, url: str, membership: Membership, interval: float = 0.05):
        super().__init__(daemon=True, name="scale-sampler")
        self.conn = psycopg.connect(url, autocommit=True, application_name="scale-sampler")
        self.membership = membership
        self.interval = interval
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.samples: list[Sample] = []
        self.violations: list[str] = []
        self.unknown_owners: set[str] = set()

    def read(self) -> Sample:
        rows = self.conn.execute(
            "SELECT extract(epoch FROM clock_timestamp())::float8, shard, claim_version,"
            " CASE WHEN lease_expires > clock_timestamp() THEN owner::text END"
            " FROM shardq_shard WHERE pool = '*' AND shard < %s ORDER BY shard",
            (SHARDS,),
        ).fetchall()
        return Sample(
            at=rows[0][0] if rows else time.time(),
            owners={shard: owner for _, shard, _, owner in rows},
            versions={shard: version for _, shard, version, _ in rows},
        )

    def run(self) -> None:
        while not self.stop.is_set():
            sample = self.read()
            with self.lock:
                self.check(sample)
                self.samples.append(sample)
            self.stop.wait(self.interval)
        self.conn.close()

    def check(self, sample: Sample) -> None:
        m = self.membership
        for shard, owner in sample.owners.items():
            if owner is None or owner in m.alive:
                continue
            killed = m.killed_at.get(owner)
            if killed is None:
                # A worker leases shards before the test has read its id
                # (registration, then its first claim, then its signal
                # handlers): checked against the started workers later.
                self.unknown_owners.add(owner)
            elif sample.at > killed + TTL + 0.25:  # the lease outlived its TTL after the kill
                self.violations.append(
                    f"{sample.at:.3f}: shard {shard} still leased to {owner}, killed at {killed:.3f}"
                )
        base = m.stable_since
        if base is not None:
            unowned = sorted(s for s, o in sample.owners.items() if o is None)
            if unowned:
                self.violations.append(f"{sample.at:.3f}: stable membership, shards {unowned} have no live owner")
            moved = sorted(
                s for s in sample.owners if sample.owners[s] != base.owners[s] or sample.versions[s] != base.versions[s]
            )
            if moved:
                self.violations.append(f"{sample.at:.3f}: stable membership, shards {moved} changed owner or version")

    def latest(self) -> Sample:
        wait_until(lambda: self.samples, timeout=10, message="a first ownership sample")
        with self.lock:
            return self.samples[-1]

    def since(self, at: float) -> list[Sample]:
        with self.lock:
            return [s for s in self.samples if s.at >= at]


def shares(sample: Sample) -> dict[str, int]:
    out: dict[str, int] = {}
    for owner in sample.owners.values():
        if owner is not None:
            out[owner] = out.get(owner, 0) + 1
    return out


def settled(sample: Sample, alive: set[str]) -> bool:
    """Every shard live-owned by a live worker, every live worker holding a share within 1 of the others."""
    held = shares(sample)
    if set(held) != alive or None in sample.owners.values():
        return False
    return max(held.values()) - min(held.values()) <= 1


def normalized(sql: str) -> str:
    """A statement with comments, parameters and constants folded, as
    pg_stat_statements and shardq/db/sql can be compared."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"%\(\w+\)s|\$\d+|'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b", "?", sql)
    return re.sub(r"\s+", " ", sql).strip().rstrip(";").strip()


STATEMENT_NAMES = {normalized(text): name for name, text in QUERIES.items()}


class Observer:
    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True, application_name="scale-observer")

    def sql(self, query: str, params=None) -> list[tuple]:
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def worker_ids(self) -> dict[int, str]:
        return {pid: wid for wid, pid in self.sql("SELECT id::text, pid FROM shardq_worker WHERE state = 'RUNNING'")}

    def heartbeats(self) -> int:
        return int(self.sql("SELECT coalesce(sum((stats->>'heartbeats')::bigint), 0)::bigint FROM shardq_worker")[0][0])

    def statement_calls(self) -> dict[str, int]:
        """Calls since the last reset, by block name (shardq/db/sql), of the workers' role."""
        calls: dict[str, int] = {}
        for query, n in self.sql(
            "SELECT query, calls FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid"
            " WHERE r.rolname = 'postgres' AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ):
            name = STATEMENT_NAMES.get(normalized(query), "other")
            calls[name] = calls.get(name, 0) + n
        return calls

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def server():
    pg = ScalePostgres(settings={"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "1000"})
    try:
        pg.prepare()
        with psycopg.connect(pg.url_for(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        yield pg
    finally:
        pg.destroy()


def test_many_workers_share_64_shards_evenly_settle_fast_and_stay_put(server, tmp_path):
    url = server.url_for()
    observer = Observer(server.url_for(user="observer"))
    observer.sql(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered,"
        " status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at)"
        " SELECT %s, 'default', 'default', 0, clock_timestamp(), g %% 64, g, false, 'READY', 0, 0, 0, 1, '[]',"
        " jsonb_build_object('seconds', %s::float8), '[]', '[]', clock_timestamp() FROM generate_series(1, %s) g",
        [TASK, NAP_SECONDS, int(WORKERS / NAP_SECONDS * (STABLE_SECONDS + 120))],
    )
    membership = Membership()
    sampler = Sampler(server.url_for(user="observer"), membership)
    pool = WorkerPool(tmp_path)
    procs: dict[str, object] = {}
    joins: list[float] = []
    per_heartbeat: dict[int, dict[str, float]] = {}
    try:
        sampler.start()
        for n in range(1, WORKERS + 1):
            proc = pool.start("--concurrency", "1", env={"DATABASE_URL": url})
            wid = wait_until(lambda: observer.worker_ids().get(proc.pid), timeout=30, message="the worker to register")
            registered = observer.sql(
                "SELECT extract(epoch FROM started_at)::float8 FROM shardq_worker WHERE id = %s", [wid]
            )[0][0]
            procs[wid] = proc
            with sampler.lock:
                membership.alive.add(wid)
            first = wait_until(
                lambda: next((s for s in sampler.since(registered) if settled(s, membership.alive)), None),
                timeout=30,
                message=lambda: f"{n} workers to settle: {shares(sampler.latest())}",
            )
            if n > 1:
                joins.append(first.at - registered)
            if n in SIZES:
                # A stable window: ownership must not move, and the lease
                # statements are counted per worker per heartbeat.
                with sampler.lock:
                    membership.stable_since = (
                        sampler.samples[-1] if settled(sampler.samples[-1], membership.alive) else None
                    )
                if membership.stable_since is None:
                    wait_until(lambda: settled(sampler.latest(), membership.alive), timeout=10)
                    with sampler.lock:
                        membership.stable_since = sampler.samples[-1]
                observer.sql("SELECT pg_stat_statements_reset()")
                beats_before = observer.heartbeats()
                time.sleep(STABLE_SECONDS if n == WORKERS else WINDOW_SECONDS)  # the window's length is the measurement
                calls = observer.statement_calls()
                beats = observer.heartbeats() - beats_before
                with sampler.lock:
                    membership.stable_since = None
                assert beats >= n * (WINDOW_SECONDS / HEARTBEAT) * 0.5, (n, beats)
                per_heartbeat[n] = {name: calls.get(name, 0) / beats for name in (*LEASE_STATEMENTS, "notify")}
                assert not sampler.violations, sampler.violations[:10]
                assert sampler.unknown_owners <= set(procs), sampler.unknown_owners - set(procs)

        # A quarter of the workers dies at once.
        before = shares(sampler.latest())
        victims = sorted(procs)[:KILLED]
        orphaned = sum(before[v] for v in victims)
        killed_at = time.time()
        with sampler.lock:
            for victim in victims:
                membership.alive.discard(victim)
                membership.killed_at[victim] = killed_at
        for victim in victims:
            kill_tree(procs[victim].pid)
        survivors = set(procs) - set(victims)
        dispersed = wait_until(
            lambda: next((s for s in sampler.since(killed_at) if settled(s, survivors)), None),
            timeout=TTL * 4 + 10,
            message=lambda: f"the survivors to take the orphaned shards: {shares(sampler.latest())}",
        )
        bound = math.ceil(orphaned / len(survivors)) + 1
        gains = [
            max(shares(s).get(w, 0) - before[w] for w in survivors)
            for s in sampler.since(killed_at)
            if s.at <= dispersed.at + 2
        ]
        assert max(gains) <= bound, (max(gains), bound)
        assert not sampler.violations, sampler.violations[:10]
        assert sampler.unknown_owners <= set(procs), sampler.unknown_owners - set(procs)
    finally:
        sampler.stop.set()
        sampler.join(timeout=5)
        pool.stop_all()
        observer.close()

    for n, counts in per_heartbeat.items():
        per_heartbeat[n]["lease_total"] = sum(counts[name] for name in LEASE_STATEMENTS)
    totals = [per_heartbeat[n]["lease_total"] for n in SIZES]
    # Constant as workers grow: the largest size costs no more per worker
    # per heartbeat than the smallest (a join's claims and releases aside,
    # none fall in a stable window; 10 % for a heartbeat counted at a window's edge).
    assert max(totals) <= totals[0] * 1.1 + 0.05, per_heartbeat
    assert all(j <= 2 * HEARTBEAT for j in joins), joins
    figures(
        "scale_coordination",
        workers=WORKERS,
        killed=KILLED,
        stable_seconds=STABLE_SECONDS,
        join_settle_median_s=sorted(joins)[len(joins) // 2],
        join_settle_max_s=max(joins),
        heartbeat_s=HEARTBEAT,
        ttl_s=TTL,
        orphaned=orphaned,
        dispersal_s=dispersed.at - killed_at,
        max_gain=max(gains),
        gain_bound=bound,
        lease_statements_per_worker_heartbeat={n: round(per_heartbeat[n]["lease_total"], 3) for n in SIZES},
        by_statement={n: {k: round(v, 3) for k, v in per_heartbeat[n].items() if v} for n in SIZES},
        samples=len(sampler.samples),
        load=os.getloadavg()[0],
    )
