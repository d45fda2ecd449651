"""The physical limit: bare psycopg loops running the SQL a shardq worker needs.

No Django, no threads, no buffers: the same named statements from
``shardq/db/sql/`` (``insert_job``, ``claim_jobs``, ``complete_jobs``)
plus COPY, driven as directly as Python allows. ``bench/e2e.py`` compares the
public API and the real worker against these numbers.

Every function takes a libpq URL; the drain and latency consumers run in
their own processes (``multiprocessing`` spawn) so 1 and 2 processes compare
like for like with ``shardq_worker --processes N``.
"""

import json
import math
import random
import time
import uuid
from datetime import datetime

import psycopg

from shardq.core import pools
from shardq.db.enqueue import JOB_COLUMNS
from shardq.db.queries import QUERIES
from shardq.db.store import claim_jobs_params, claim_scope

NOOP = "tests.taskapp.tasks.noop"
SHARD_COUNT = 64
CHANNEL = "shardq"

# shardq/db/sql's job columns but the id (the sequence gives it here),
# limit_keys (NULL: no limit), key_limited (false), traceparent (NULL:
# untraced) and the fair key and weight (NULL: none): the columns' defaults.
COLUMNS = tuple(
    name
    for name in JOB_COLUMNS
    if name not in ("id", "limit_keys", "key_limited", "traceparent", "fair_key", "fair_weight")
)


def noop():
    return None


def connect(url: str, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=autocommit, application_name="shardq-bench")


def insert_params(key_hash: int | None = None) -> dict:
    """The parameters ``insert_job`` gets from the backend for one ``noop()`` call."""
    key_hash = random.getrandbits(32) - 2**31 if key_hash is None else key_hash
    return {
        "task_path": NOOP,
        "backend": "default",
        "queue_name": "default",
        "priority": 0,
        "run_after": None,
        "ordered": False,
        "max_attempts": 1,
        "channel": CHANNEL,
        "notify": True,
        "shard_count": SHARD_COUNT,  # only when the cluster row is missing (the statement computes the shard)
        "limit_keys": None,
        "key_limited": False,
        "traceparent": None,
        "fair_key": None,
        "fair_weight": None,
        "tags": None,
        "key_hash": key_hash,
        "shard_key": None,
        "args": "[]",
        "kwargs": "{}",
    }


# -- enqueue ----------------------------------------------------------------------


def copy_enqueue(url: str, n: int) -> float:
    """COPY ``n`` noop jobs in one transaction; returns seconds."""
    with connect(url, autocommit=False) as conn:
        now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        started = time.perf_counter()
        with conn.cursor() as cursor:
            with cursor.copy(f"COPY shardq_job ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for _ in range(n):
                    key_hash = random.getrandbits(32) - 2**31
                    copy.write_row(
                        (
                            NOOP,
                            "default",
                            "default",
                            0,
                            now,
                            key_hash & (SHARD_COUNT - 1),
                            key_hash,
                            None,
                            False,
                            "READY",
                            0,
                            0,
                            0,
                            1,
                            "[]",
                            "{}",
                            "[]",
                            "[]",
                            now,
                            None,  # tags
                        )
                    )
            cursor.execute("SELECT pg_notify(%s, '0')", (CHANNEL,))
        conn.commit()
        return time.perf_counter() - started


def insert_enqueue(url: str, n: int, *, transaction: bool) -> float:
    """``n`` × ``insert_job`` (the backend's statement, NOTIFY included), prepared;
    in one transaction or each in its own (autocommit). Returns seconds."""
    query = QUERIES["insert_job"]
    with connect(url, autocommit=True) as conn:
        conn.execute(query, insert_params(), prepare=True)  # warm: plan and prepare
        started = time.perf_counter()
        if transaction:
            with conn.transaction():
                for _ in range(n):
                    conn.execute(query, insert_params(), prepare=True).fetchone()
        else:
            for _ in range(n):
                conn.execute(query, insert_params(), prepare=True).fetchone()
        return time.perf_counter() - started


def steady_enqueue(url: str, rate: float, seconds: float) -> int:
    """``insert_job`` at a steady ``rate`` jobs/s (autocommit) for ``seconds``."""
    query = QUERIES["insert_job"]
    count = int(rate * seconds)
    with connect(url) as conn:
        started = time.perf_counter()
        for i in range(count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            conn.execute(query, insert_params(), prepare=True).fetchone()
    return count


def fill(url: str, n: int) -> None:
    """``n`` READY noop jobs in one server-side statement (setup, not measured), then ANALYZE."""
    with connect(url) as conn:
        conn.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, shard_key, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at)
            SELECT %(task)s, 'default', 'default', 0, t, h & 63, h, NULL, false, 'READY', 0, 0, 0, 1,
                   '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, t
            FROM (SELECT (random() * 4294967295 - 2147483648)::bigint::int AS h, clock_timestamp() AS t
                  FROM generate_series(1, %(n)s)) AS g
            """,
            {"task": NOOP, "n": n},
        )
        conn.execute("ANALYZE shardq_job")


# -- shards -------------------------------------------------------------------------


def own_shards(url: str, worker: str, shards: list[int]) -> None:
    """Make ``worker`` (a fake worker id) the owner of ``shards`` for an hour."""
    with connect(url) as conn:
        conn.execute(
            "UPDATE shardq_shard SET owner = %s, claim_version = claim_version + 1,"
            " lease_expires = clock_timestamp() + interval '1 hour', claimed_at = clock_timestamp()"
            " WHERE pool = %s AND shard = ANY(%s)",
            (worker, pools.ALL, shards),
        )


def split_shards(processes: int) -> list[list[int]]:
    return [[s for s in range(SHARD_COUNT) if s % processes == p] for p in range(processes)]


# -- the drain loop --------------------------------------------------------------------


class Drainer:
    """One connection: claim a batch over every owned shard, then per job its
    start (``start_jobs``: RUNNING, the attempt counted, as the worker writes
    it when a thread begins the job, never ahead) and a noop() call; ack the
    batch with one fenced ``complete_jobs``.

    ``start_ahead`` is the limit of the worker before issue 24: every
    claimed job's start written at once, ahead of its call (jobs read
    RUNNING before anything runs them). The claim no longer has a start
    variant, so this loop writes the batch's starts in one ``start_jobs``
    right after the claim: one statement per batch more than the old
    claim that started its jobs itself."""

    def __init__(self, url: str, worker: str, shards: list[int], batch: int = 256, start_ahead: bool = False):
        self.start_ahead = start_ahead
        self.conn = connect(url)
        self.worker = worker
        self.shards = shards
        self.batch = batch
        self.per_shard = max(1, math.ceil(2 * batch / len(shards)))
        self.done = 0
        # (wall clock, this process's CPU seconds) after every ack: the CPU
        # spent between two database timestamps (bench/e2e.py's CPU per job).
        self.cpu_samples: list[tuple[float, float]] = []

    def claim(self, per_shard: int, limit: int | None = None) -> list[tuple]:
        return self.conn.execute(
            QUERIES["claim_jobs"],
            {
                # A worker serving every queue.
                **claim_scope(self.worker, self.shards, pools.ALL, None, None, None, per_shard),
                **claim_jobs_params(self.batch if limit is None else limit),
            },
            prepare=True,
            binary=True,
        ).fetchall()

    def warm(self) -> None:
        """Prepare both statements without claiming anything (LIMIT 0, no ids)."""
        self.claim(self.per_shard, limit=0)
        self.conn.execute(QUERIES["complete_jobs"], {"ids": [], "batch": "[]", "now": None}, prepare=True).fetchall()

    def run_batch(self, rows: list[tuple]) -> None:
        ids, acks = [], []
        start = QUERIES["start_jobs"]
        ranks: dict[int, int] = {}
        if self.start_ahead:
            # Every start of the batch at once, ahead of the calls.
            ranks = {
                started[0]: started[2]
                for started in self.conn.execute(
                    start,
                    {
                        "worker": self.worker,
                        "ids": [row[0] for row in rows],
                        "fences": [row[12] for row in rows],
                        "ranks": [row[13] for row in rows],
                        "now": None,
                    },
                    prepare=True,
                    binary=True,
                ).fetchall()
            }
        for row in rows:
            rank = ranks.get(row[0], row[13])
            if not self.start_ahead:
                # The start, as the job begins: one statement a job (one thread).
                rank = self.conn.execute(
                    start,
                    {"worker": self.worker, "ids": [row[0]], "fences": [row[12]], "ranks": [rank], "now": None},
                    prepare=True,
                    binary=True,
                ).fetchall()[0][2]
            # Arguments come back as JSON text (the worker's claim): decode, call.
            noop(*json.loads(row[8]), **json.loads(row[9]))
            ids.append(row[0])
            acks.append(
                f'{{"id":{row[0]:d},"fence":{row[12]:d},"rank":{rank + 1:d},'
                '"status":"SUCCESSFUL","delay":0.0,"return_value":null}'
            )
        self.conn.execute(
            QUERIES["complete_jobs"], {"ids": ids, "batch": "[" + ",".join(acks) + "]", "now": None}, prepare=True
        ).fetchall()
        self.done += len(rows)
        self.cpu_samples.append((time.time(), time.process_time()))

    def claim_and_run(self) -> list[tuple]:
        rows = self.claim(self.per_shard)
        if rows:
            self.run_batch(rows)
        return rows

    def drain_available(self, max_jobs: int | None = None) -> int:
        """Claim and run until a deep claim finds nothing (or ``max_jobs`` ran)."""
        ran = 0
        while max_jobs is None or self.done < max_jobs:
            rows = self.claim(self.per_shard) or self.claim(self.batch)
            if not rows:
                break
            self.run_batch(rows)
            ran += len(rows)
        return ran


def drain_process(url: str, worker: str, shards: list[int], ready, go, max_jobs, batch: int = 256, report=None) -> None:
    """Entry point of one limit drain process (multiprocessing target); puts
    its CPU samples on ``report`` (a queue) when given."""
    drainer = Drainer(url, worker, shards, batch)
    drainer.warm()
    ready.set()
    go.wait()
    drainer.cpu_samples.append((time.time(), time.process_time()))
    drainer.drain_available(max_jobs)
    drainer.conn.close()
    if report is not None:
        report.put(drainer.cpu_samples)


def consume_process(url: str, worker: str, shards: list[int], listen: bool, poll_seconds: float, ready, stop) -> None:
    """Entry point of a limit latency consumer: LISTEN (or poll), then claim, run, ack."""
    # Poll only: one wide claim a tick takes all that arrived in the interval.
    drainer = Drainer(url, worker, shards, batch=64 if listen else 1024)
    drainer.warm()
    listener = connect(url)
    if listen:
        listener.execute(f'LISTEN "{CHANNEL}"')
    ready.set()
    while not stop.is_set():
        if listen:
            for _ in listener.notifies(timeout=poll_seconds, stop_after=1):
                pass
            for _ in listener.notifies(timeout=0.001):  # coalesce the ones already queued
                pass
        else:
            time.sleep(poll_seconds)
        # Claim until a batch comes back short, then wait again: a NOTIFY that
        # arrived meanwhile is already queued on the listening connection.
        while len(drainer.claim_and_run()) == drainer.batch:
            pass
    listener.close()
    drainer.conn.close()


def new_worker_id() -> str:
    return str(uuid.uuid4())


def db_now(url: str) -> datetime:
    with connect(url) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]
