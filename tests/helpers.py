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
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from django.db import connection

JSON_COLUMNS = {"args", "kwargs", "return_value", "errors", "worker_ids"}


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
