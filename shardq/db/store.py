"""The one place that runs shardq's SQL (``queries.sql``).

``WorkerStore`` owns a worker's psycopg connections; the enqueue path runs on
the caller's Django connection (see ``backend.py``). Driver errors are
translated at this boundary into ``DatabaseUnavailable``.
"""

import json
import logging
import threading
import time

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

from ..conf import get_config
from ..core.breaker import CircuitBreaker
from ..exceptions import DatabaseUnavailable
from .queries import QUERIES

logger = logging.getLogger("shardq.store")


def ensure_shards(sender=None, using=DEFAULT_DB_ALIAS, **kwargs):
    """post_migrate: one shardq_shard row per configured shard."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["ensure_shards"], {"count": get_config().shard_count})


def connection_kwargs(alias: str = DEFAULT_DB_ALIAS) -> dict:
    """psycopg connect() arguments of a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    params.pop("pool", None)
    params.pop("assume_role", None)
    return params


def connect(alias: str = DEFAULT_DB_ALIAS, autocommit: bool = True, application_name: str = "shardq") -> psycopg.Connection:
    try:
        return psycopg.connect(
            **connection_kwargs(alias), autocommit=autocommit, application_name=application_name
        )
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {exc}".strip()) from exc


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def is_connection_error(exc: Exception) -> bool:
    """The server is unreachable or went away (not a statement-level error
    such as a deadlock): only these count toward opening the circuit."""
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57"))


class DatabaseGuard:
    """One circuit breaker for all of a worker's connections.

    When most recent database calls failed because the server is unreachable,
    calls are refused at once with ``DatabaseUnavailable`` ("database
    unavailable") and a single probe is let through after a backoff (0.5 s,
    doubling up to 5 s), instead of every service hammering a dead server.
    """

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.breaker = CircuitBreaker(failure_ratio=0.5, min_calls=3, window_seconds=10.0,
                                      base_backoff_seconds=0.5, max_backoff_seconds=5.0)
        self.lock = threading.Lock()

    def admit(self, what: str) -> None:
        now = self.clock()
        with self.lock:
            if self.breaker.allow(now):
                return
            retry_in = self.breaker.retry_in(now)
        raise DatabaseUnavailable(f"database unavailable (circuit open; next probe in {retry_in:.1f}s): {what} not sent")

    def succeeded(self) -> None:
        with self.lock:
            self.breaker.record_success(self.clock())

    def failed(self) -> None:
        with self.lock:
            self.breaker.record_failure(self.clock())

    @property
    def state(self) -> str:
        with self.lock:
            return self.breaker.state


def outcome_batch_json(outcomes: list) -> str:
    """The outcomes as one JSON array for ``jsonb_to_recordset``.

    Built by string formatting because the return values and errors already
    are JSON text: nothing is encoded twice. An absent key reads as SQL NULL.
    """
    parts = []
    for o in outcomes:
        extra = ""
        if o.return_value_json is not None:
            extra += ',"return_value":' + o.return_value_json
        if o.error_json is not None:
            extra += ',"error":' + o.error_json
        parts.append('{"id":%d,"fence":%d,"rank":%d,"status":"%s","delay":%r%s}'
                     % (o.id, o.fence, o.rank, o.status, float(o.delay), extra))
    return "[" + ",".join(parts) + "]"


class WorkerStore:
    """One psycopg connection (autocommit) and the worker statements run on it.

    Not shared between threads: each worker service (leaser, fetcher,
    completer) owns one. A broken connection is dropped and re-opened on the
    next call; the failed call raises ``DatabaseUnavailable``.
    """

    def __init__(self, alias: str = DEFAULT_DB_ALIAS, application_name: str = "shardq",
                 guard: "DatabaseGuard | None" = None, synchronous_commit: bool = True):
        self.alias = alias
        self.application_name = application_name
        self.guard = guard or DatabaseGuard()
        self.synchronous_commit = synchronous_commit
        self.conn: psycopg.Connection | None = None

    def _cursor(self):
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.alias, application_name=self.application_name)
            if not self.synchronous_commit:
                self.conn.execute("SET synchronous_commit = off")
        return self.conn.cursor()

    def run(self, name: str, params: dict, fetch: str = "all", binary: bool = False):
        self.guard.admit(name)
        try:
            with self._cursor() as cursor:
                cursor.execute(QUERIES[name], params, prepare=True, binary=binary)
                if fetch == "all":
                    result = cursor.fetchall()
                elif fetch == "one":
                    result = cursor.fetchone()
                else:
                    result = cursor.rowcount
        except DatabaseUnavailable:
            self.guard.failed()
            raise
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if is_connection_error(exc) or self.conn is None or self.conn.broken:
                self.guard.failed()
            self.close()
            raise DatabaseUnavailable(f"{name}: {exc}".strip()) from exc
        self.guard.succeeded()
        return result

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # closing a broken connection may fail; it is gone either way
                pass
            self.conn = None

    # -- leases ---------------------------------------------------------------

    def register_worker(self, worker: str, host: str, pid: int, queues: list[str]) -> None:
        self.run("register_worker", {"worker": worker, "host": host, "pid": pid, "queues": dumps(queues)}, fetch="none")

    def heartbeat(self, worker: str, stats: dict, ttl: float) -> list[str]:
        rows = self.run("heartbeat", {"worker": worker, "stats": dumps(stats), "ttl": ttl})
        return [str(row[0]) for row in rows]

    def claim_shards(self, worker: str, wanted: int, ttl: float, shard_count: int) -> list[tuple]:
        return self.run(
            "claim_shards", {"worker": worker, "wanted": wanted, "ttl": ttl, "shard_count": shard_count}
        )

    def renew_leases(self, worker: str, held: dict[int, int], ttl: float) -> set[int]:
        shards = list(held)
        rows = self.run(
            "renew_leases",
            {"worker": worker, "ttl": ttl, "shards": shards, "versions": [held[s] for s in shards]},
        )
        return {row[0] for row in rows}

    def release_shards(self, worker: str, pairs: dict[int, int]) -> set[int]:
        shards = list(pairs)
        rows = self.run(
            "release_shards",
            {"worker": worker, "shards": shards, "versions": [pairs[s] for s in shards]},
        )
        return {row[0] for row in rows}

    def stop_worker(self, worker: str, stats: dict) -> None:
        self.run("stop_worker", {"worker": worker, "stats": dumps(stats)}, fetch="none")

    def notify(self, channel: str, payload: str) -> None:
        try:
            with self._cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", (channel, payload))
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self.close()
            raise DatabaseUnavailable(f"notify: {exc}") from exc

    # -- jobs -----------------------------------------------------------------

    def claim_jobs(self, worker: str, shards: list[int], queues: list[str] | None, per_shard: int,
                   limit: int, lookahead: float = 0.0) -> list[tuple]:
        # Binary results: timestamps and numbers decode without parsing text.
        params = {
            "worker": worker,
            "worker_id": worker,
            "shards": shards,
            "queues": queues or [],
            "all_queues": not queues,
            "per_shard": per_shard,
            "limit": limit,
            "lookahead": lookahead,
        }
        return self.run("claim_jobs", params, binary=True)

    def my_running_jobs(self, worker: str, shards: list[int]) -> list[tuple]:
        return self.run("my_running_jobs", {"worker": worker, "shards": shards})

    def seconds_until_due(self, shards: list[int]) -> float | None:
        row = self.run("seconds_until_due", {"shards": shards}, fetch="one")
        return row[0] if row else None

    def rescue_stale_claims(self, worker: str, shards: list[int]) -> int:
        return len(self.run("rescue_stale_claims", {"worker": worker, "shards": shards}))

    def complete_jobs(self, outcomes: list) -> set[tuple[int, int]]:
        """Write outcomes (objects with id, fence, rank, status, return_value_json,
        error_json, delay) in one statement; returns the (id, rank) pairs written.

        Pairs, not ids: one batch may hold two outcomes of a job (a rejected
        one and the one written again under a later claim, see
        ``Completer.recall``), and only one of them can land."""
        # The ids as one array literal: psycopg's list dumper costs a Python
        # call per element, a tenth of the completer's time at no-op rates.
        ids = "{" + ",".join([str(o.id) for o in outcomes]) + "}"
        rows = self.run("complete_jobs", {"ids": ids, "batch": outcome_batch_json(outcomes)})
        return {(job_id, rank) for job_id, rank in rows}

    def outcomes_applied(self, outcomes: list) -> set[tuple[int, int]]:
        rows = self.run(
            "outcomes_applied",
            {"ids": [o.id for o in outcomes], "fences": [o.fence for o in outcomes], "ranks": [o.rank for o in outcomes]},
        )
        return {(job_id, rank) for job_id, rank in rows}

    def return_jobs(self, jobs: list) -> set[int]:
        """Put claimed-but-unstarted jobs back to READY (objects with id, fence, status_rank)."""
        rows = self.run(
            "return_jobs",
            {"ids": [j.id for j in jobs], "fences": [j.fence for j in jobs], "ranks": [j.status_rank + 1 for j in jobs]},
        )
        return {row[0] for row in rows}
