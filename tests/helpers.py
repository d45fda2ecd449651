"""The shared parts of the tests: polling, plain SQL on the test database, and
factories for the rows a test needs in a given state.

Tests read and set state the way an operator would, with SQL on Django's
connection to the test database; the factories write the rows the real
code paths would (a job as enqueue writes it, a lease as ``claim_shards``
takes it), so a test names only what differs from the ordinary.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from django.db import connection

JSON_COLUMNS = {"args", "kwargs", "return_value", "errors", "worker_ids", "logs"}


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, message: Any = ""):
    """Poll ``predicate`` until it returns a truthy value (returned) or the
    deadline passes (AssertionError naming ``message``, or a callable's answer)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            what = message() if callable(message) else (message or predicate)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def sql(statement: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple]:
    """Run one statement on Django's connection; its rows ([] when it returns none)."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def scalar(statement: str, params: Sequence[Any] | dict[str, Any] | None = None) -> Any:
    """The first column of the first row (None when there is no row)."""
    rows = sql(statement, params)
    return rows[0][0] if rows else None


@contextlib.contextmanager
def indexes_built_after(*tables: str) -> Iterator[None]:
    """For a bulk fill of ``tables``: their secondary indexes (every one
    that backs no constraint) dropped, then built again from their own
    definitions, in their order, once the block has written its rows; all
    in one transaction (the caller's, or one of its own), so a fill that
    fails leaves every index as it was. The indexes end as a restore builds
    them, and as bench/admin_10m.py fills its ten million jobs; the tests
    that EXPLAIN over a backlog read the same plans. Keeping shardq_job's
    18 secondary indexes (two GIN, a hash) up row by row made the admin
    tests' 300,000-job fill take 71 s at load 5, against 16 s for the same
    insert with the indexes built after it."""
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index AS i"
            " WHERE i.indrelid = ANY (%s::regclass[])"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint AS c WHERE c.conindid = i.indexrelid)"
            " ORDER BY i.indexrelid",
            [list(tables)],
        )
        definitions = cursor.fetchall()
        for name, _ in definitions:
            cursor.execute(f"DROP INDEX {name}")  # regclass text: quoted as needed
        yield
        for _, definition in definitions:
            # A partitioned table's index reads "ON ONLY" (the parent's
            # alone); built without ONLY it is built on every partition.
            cursor.execute(definition.replace(" ON ONLY ", " ON ", 1))


def job_row(job_id: int | str) -> dict[str, Any] | None:
    """The ``shardq_job`` row of a job id as a dict, JSON columns decoded (None when there is none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM shardq_job WHERE id = %s", [int(job_id)])
        row = cursor.fetchone()
        if row is None:
            return None
        names = [c.name for c in cursor.description]
    # Django's cursor hands jsonb back as text.
    return {
        name: json.loads(value) if name in JSON_COLUMNS and isinstance(value, str) else value
        for name, value in zip(names, row, strict=True)
    }


def edge_violations() -> int:
    """Edges whose child started before its parent finished (or started at
    all after a failed parent, unless it asked to run)."""
    return scalar(
        """
        SELECT count(*) FROM shardq_edge AS e
        JOIN shardq_job AS p ON p.id = e.parent JOIN shardq_job AS c ON c.id = e.child
        WHERE c.started_at IS NOT NULL
          AND (p.finished_at IS NULL OR c.started_at < p.finished_at
               OR (p.status <> 'SUCCESSFUL' AND NOT e.run_on_failure))
        """
    )


def job_factory(
    count: int = 1,
    *,
    task_path: str = "tests.taskapp.tasks.noop",
    shard: int | Callable[[int], int] = 0,
    priority: int | Callable[[int], int] = 0,
    delay: float = 0.0,
    status: str = "READY",
    ordered: bool = False,
    shard_key: str | None = None,
    key_hash: int | None = None,
    queue_name: str = "default",
    backend: str = "default",
    max_attempts: int = 1,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    worker_losses: int = 0,
    last_attempted_ago: float | None = None,
) -> list[int]:
    """Insert ``count`` jobs as enqueue writes them (READY, nothing attempted)
    and return their ids in order. ``shard`` and ``priority`` may be functions
    of the job's index; ``delay`` puts ``run_after`` that many seconds ahead;
    ``last_attempted_ago`` (seconds) dates an earlier attempt, as a job that
    lost a worker has one. No NOTIFY is sent: a test that wants a worker to
    wake says so."""
    ids = []
    for i in range(count):
        job_shard = shard(i) if callable(shard) else shard
        job_priority = priority(i) if callable(priority) else priority
        [(job_id,)] = sql(
            "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, "
            "shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, "
            "worker_ids, enqueued_at, worker_losses, last_attempted_at) "
            "VALUES (%s, %s, %s, %s, clock_timestamp() + make_interval(secs => %s), %s, %s, %s, %s, %s, 0, 0, 0, "
            "%s, %s::jsonb, %s::jsonb, '[]', '[]', clock_timestamp(), %s, "
            "clock_timestamp() - make_interval(secs => %s)) RETURNING id",
            [
                task_path,
                backend,
                queue_name,
                job_priority,
                delay,
                job_shard,
                job_shard if key_hash is None else key_hash,
                shard_key if shard_key is not None else ("k" if ordered else None),
                ordered,
                status,
                max_attempts,
                json.dumps(list(args)),
                json.dumps(kwargs or {}),
                worker_losses,
                last_attempted_ago,
            ],
        )
        ids.append(job_id)
    return ids


def leased_shard_factory(
    shards: Iterable[int],
    *,
    worker: str | None = None,
    lease_seconds: float = 60.0,
    pool: str = "*",
    log_event: bool = False,
) -> tuple[str, dict[int, int]]:
    """``worker`` (a fresh id when None) holds ``shards`` of ``pool`` as
    ``claim_shards`` leaves them: a new claim version from the sequence, the
    lease until now + ``lease_seconds`` (negative: already expired). Returns
    the worker id and each shard's claim version. ``log_event`` also writes
    the takeover's ``shardq_shard_event`` row, as the admin's history shows it."""
    from shardq.db.store import ensure_shards

    ensure_shards()  # a transactional test's flush may have removed the rows
    worker = worker or str(uuid.uuid4())
    taken = sql(
        "UPDATE shardq_shard SET owner = %s, claim_version = nextval('shardq_claim_version_seq'), "
        "lease_expires = clock_timestamp() + make_interval(secs => %s), claimed_at = clock_timestamp() "
        "WHERE shard = ANY(%s) AND pool = %s RETURNING shard, claim_version",
        [worker, lease_seconds, list(shards), pool],
    )
    if log_event:
        sql(
            "INSERT INTO shardq_shard_event (shard, claim_version, worker, reason, rescued, at, pool) "
            "SELECT shard, version, %s, 'claim', 0, clock_timestamp(), %s "
            "FROM unnest(%s::int[], %s::bigint[]) AS t(shard, version)",
            [worker, pool, [s for s, _ in taken], [v for _, v in taken]],
        )
    return worker, dict(taken)


def pipeline_factory(store: Any, worker_id: str | None = None, **options: Any) -> tuple[Any, Any]:
    """(config, pipeline) of one worker's services, built as ``Worker`` builds
    them (``options`` as ``WorkerOptions`` takes them), for a test that drives
    one service in this process; ``store`` also serves its hand-backs."""
    from shardq.worker.handback import HandBack
    from shardq.worker.pipeline import Pipeline, PipelineConfig, WorkerOptions
    from shardq.worker.stats import Stats

    config = PipelineConfig.build(WorkerOptions(**options), worker_id or str(uuid.uuid4()))
    stats = Stats()
    return config, Pipeline(config, stats, HandBack(store, stats))


@contextlib.contextmanager
def in_process_worker(**options: Any) -> Iterator[Any]:
    """A ``Worker`` (``options`` as its constructor takes them) running on a
    thread of this process until it holds all 64 shards; stopped and joined
    on exit. For tests that look inside the worker; tests of the process
    (signals, exit codes) start real ``shardq_worker`` commands instead
    (tests/workers.py)."""
    from shardq.db.store import ensure_shards
    from shardq.worker.runtime import Worker, WorkerOptions

    ensure_shards()  # a transactional test's flush may have removed the rows
    metrics = options.pop("metrics", None)
    worker = Worker(WorkerOptions(**options), metrics=metrics)
    thread = threading.Thread(target=worker.run, name="test-worker")
    thread.start()
    try:
        wait_until(lambda: len(worker.leaser.held) == 64, timeout=30, message="the worker to hold 64 shards")
        yield worker
    finally:
        worker.request_stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the in-process worker did not stop within 60 s"


class SteppedWorker:
    """One worker's stages, built as ``Worker`` builds them, in this process
    on the test database, with the pipeline's test signals on
    (shardq/worker/testsignal.py) and no thread of their own until a test
    asks: the test steps the producers (the leaser's round, the fetcher's
    claim, the completer's write) and awaits the consumers (the executor
    threads) through the signals, never by sleeping or polling the table.

    ``lease()`` takes the worker's share of shards; ``claim()`` runs one
    fetcher round and returns the jobs it buffered; ``run(n)`` waits for the
    executors to queue ``n`` outcomes (starting their threads the first
    time); ``write()`` writes every queued outcome; ``step()`` is one of each
    and ``drain()`` steps until a claim finds nothing. ``signals`` is the
    pipeline's ``PipelineSignals`` for what else a test awaits, ``worker``
    the ``Worker`` (its ``fetcher``, ``executor``, ``completer``, ``buffer``,
    ``stats``)."""

    def __init__(self, worker: Any) -> None:
        from shardq.tasks import autodiscover

        autodiscover(worker.config.task_modules)
        self.worker = worker
        self.signals = worker.pipeline.signals
        self.signals.init()
        self._registered = False
        self._consuming = False

    def lease(self) -> dict[int, int]:
        """Register the worker and take its share of shards (one leaser round); {shard: fence}."""
        worker = self.worker
        if not self._registered:
            worker.store["leaser"].register_worker(
                worker.id,
                "stepped",
                os.getpid(),
                worker.options.queues or [],
                pool=worker.pool,
                identity=worker.leaser.detect_dead_owners,
            )
            self._registered = True
        worker.leaser.tick()
        return dict(worker.leaser.held)

    def claim(self, count: int | None = None, rounds: int = 10) -> list[Any]:
        """One fetcher round (``Fetcher.fetch_once``): the ``ClaimedJob``s it
        buffered. With ``count``: rounds until that many are buffered (a
        shallow claim takes a few jobs of each shard, the next goes deep)."""
        jobs: list[Any] = []
        for _ in range(rounds if count else 1):
            self.worker.fetcher.fetch_once()
            jobs += [job for batch in self.signals.claimed.taken() for job in batch]
            if count is None or len(jobs) >= count:
                return jobs
        raise AssertionError(f"{rounds} claims buffered {len(jobs)} jobs, not {count}")

    def run(self, count: int, timeout: float = 30.0) -> list[Any]:
        """The next ``count`` ``Outcome``s the executor threads queue for the
        completer (a job whose task committed its own outcome, or whose
        claim was superseded, queues none)."""
        if not self._consuming:
            self.worker.handback.start()
            self.worker.executor.start()
            self._consuming = True
        return [self.signals.finished.wait(timeout) for _ in range(count)]

    def write(self) -> set[tuple[int, int]]:
        """Write every queued outcome (``Completer.flush_once``); the (id, rank) pairs that landed."""
        completer = self.worker.completer
        while completer.pending:
            completer.flush_once(block=False)
        return {pair for batch in self.signals.written.taken() for pair in batch}

    def step(self) -> list[Any]:
        """Claim, run what was claimed, write: the outcomes."""
        jobs = self.claim()
        outcomes = self.run(len(jobs))
        self.write()
        return outcomes

    def drain(self, rounds: int = 1000) -> list[Any]:
        """Step until a claim buffers nothing: every outcome, in the order queued."""
        outcomes: list[Any] = []
        for _ in range(rounds):
            jobs = self.claim()
            if not jobs:
                return outcomes
            outcomes += self.run(len(jobs))
            self.write()
        raise AssertionError(f"still claiming jobs after {rounds} rounds")

    def close(self) -> None:
        """The worker's own shutdown: buffered jobs back, threads joined, leases released."""
        self.worker.shutdown()


@contextlib.contextmanager
def stepped_worker(**options: Any) -> Iterator[SteppedWorker]:
    """A ``SteppedWorker`` (``options`` as ``WorkerOptions`` takes them)
    holding its shards; shut down on exit."""
    from shardq.db.store import ensure_shards
    from shardq.worker.runtime import Worker, WorkerOptions

    ensure_shards()  # a transactional test's flush may have removed the rows
    stepped = SteppedWorker(Worker(WorkerOptions(**options)))
    try:
        stepped.lease()
        yield stepped
    finally:
        stepped.close()
