"""The one place that runs shardq's SQL (``shardq/db/sql/``).

``WorkerStore`` owns a worker's psycopg connections; the enqueue path runs on
the caller's Django connection (see ``backend.py``). Driver errors are
translated at this boundary and classified by SQLSTATE into their error
domain (DESIGN §5):

- connection (class 08 connection exception, 57 operator intervention, 53
  insufficient resources, 40 transaction rollback, 58 system error, or a
  client-side error with no SQLSTATE): ``DatabaseUnavailable``; the caller
  backs off and sends the same fenced statement again;
- anything else (22 data exception, 23 integrity, 54 program limit exceeded,
  ...): ``StatementRejected``; sending it again would fail the same way, so
  a batch is split until the bad row is found (``run_split``) and only that
  row's job fails.
"""

import contextlib
import dataclasses
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg import sql
from psycopg.rows import RowFactory, RowMaker, TupleRow, dict_row, tuple_row
from psycopg.types.json import Jsonb

from ..conf import get_config
from ..core import pools
from ..core.breaker import CircuitBreaker
from ..exceptions import DatabaseUnavailable, StatementRejected
from .errors import tables_missing
from .queries import ANY_PRIORITY, QUERIES, RAW_QUERIES
from .queries import raw as raw_form

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger("shardq.store")

# The $n forms of the short statements a RawCursor has run (_execute).
_raw_forms: dict[str, tuple[str, tuple[str, ...]]] = {}

#: The session advisory lock (two int4 keys: 'shrq', 1) whose holder
#: computes the cluster gauges (``metrics_lock``).
METRICS_LOCK = (0x73687271, 1)
# The archiver's duty (shardq/worker/archiver.py): one session in the cluster
# moves finished jobs to shardq_job_history and keeps its partitions.
# (0x73687271, 2) is shardq_reshard's.
ARCHIVER_LOCK = (0x73687271, 3)


# The lease channel: a release NOTIFYs it (in its own statement) and a
# joining worker announces itself on it; every worker LISTENs.
LEASE_CHANNEL = "shardq_lease"


def claim_scope(
    worker: str,
    shards: list[int],
    pool: str,
    queues: list[str] | None,
    exclude_queues: list[str] | None,
    backend: str | None,
    per_shard: int,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The parameters every claim statement shares: who claims, which shards,
    the worker's queues (``queues`` None: all; ``exclude_queues``: all but
    these, --exclude-queues), its backend alias (None: any alias's jobs,
    else only jobs stored by that alias, --backend), the per-shard cap, and
    the time leases and due times are read at (None: the database's clock;
    a test's jump in time otherwise)."""
    return {
        "worker": worker,
        "shards": shards,
        "pool": pool,
        "queues": queues or [],
        "all_queues": not queues,
        "exclude_queues": exclude_queues or [],
        "backend": backend or "",
        "any_backend": backend is None,
        "per_shard": per_shard,
        "now": now,
    }


def claim_jobs_params(
    limit: int,
    lookahead: float = 0.0,
    min_priority: int = ANY_PRIORITY,
    full_keys: list[tuple[str, str]] | None = None,
    fair_after: str = "",
    full_fair_keys: list[str] | None = None,
    fair_walk: bool = True,
    fair_weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``claim_jobs``' own parameters beside ``claim_scope``'s (see
    WorkerStore.claim_jobs): the batch, the look-ahead, the priority floor,
    the local queue's full gates, and
    fairness's (docs/fairness.md): the last fair key this worker took (the
    round goes on after it; '': from the first) and the fair keys buffered
    to their share; ``fair_walk`` False while no fair key gathers jobs (the
    claim then takes a FIFO slice of each shard's fair jobs); and the
    weights the worker knows other than 1 (the round shares its batch out
    by them)."""
    weights = fair_weights or {}
    return {
        "fair_walk": fair_walk,
        "fair_weight_keys": list(weights),
        "fair_weight_values": list(weights.values()),
        "fair_after": fair_after,
        "full_fair_keys": full_fair_keys or [],
        "limit": limit,
        "min_priority": min_priority,
        "lookahead": lookahead,
        "full_tasks": [task for task, _ in full_keys or ()],
        "full_keys": [key for _, key in full_keys or ()],
    }


class JobRef(Protocol):
    """A claimed job as the store reads it (``ClaimedJob`` in the worker)."""

    @property
    def id(self) -> int: ...
    @property
    def fence(self) -> int: ...
    @property
    def status_rank(self) -> int: ...


class OutcomeRef(Protocol):
    """A job's outcome as the store writes it (``Outcome`` in the worker)."""

    @property
    def id(self) -> int: ...
    @property
    def fence(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def return_value_json(self) -> str | None: ...
    @property
    def error_json(self) -> str | None: ...
    @property
    def delay(self) -> float: ...
    @property
    def log_json(self) -> str | None: ...
    @property
    def log_bytes(self) -> int: ...


#: Rows by name, as ``named=True`` statements return them.
type NamedRow = dict[str, Any]

#: What a statement's result is read as: every row, the first row, or the row count.
type Fetch = Literal["all", "one", "none"]


def ensure_shards(sender: object = None, using: str = DEFAULT_DB_ALIAS, **kwargs: object) -> None:
    """post_migrate: the lease rows of the pool ``*`` (a worker with no
    --queues), one per configured shard. A worker creates its own pool's rows
    when it registers."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["ensure_shards"], {"count": get_config().shard_count, "pool": pools.ALL})


def sync_history_columns(sender: object = None, using: str = DEFAULT_DB_ALIAS, **kwargs: object) -> None:
    """post_migrate: every column of shardq_job that shardq_job_history lacks
    is added to it, with its type (the archiver's INSERT ... SELECT * is
    positional; docs/architecture.md, "History"). A migration that adds a
    column to shardq_job appends it, and so does this: the two stay in step
    even when the migration forgets the history. The column drift that
    remains (a column dropped, retyped or added in the middle) fails the
    archiver's statement, never silently: the test of the two tables and
    ``history_column_drift`` name it."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["history_present"])
        row = cursor.fetchone()
        if not (row and row[0]):
            return
        cursor.execute(QUERIES["history_add_missing_columns"], {})  # {}: "%%" read as "%"
        for (ddl,) in cursor.fetchall():
            logger.warning("shardq_job_history lacked a column of shardq_job: %s", ddl)
            cursor.execute(ddl)


def connection_kwargs(alias: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """psycopg connect() arguments of a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    params.pop("pool", None)
    params.pop("assume_role", None)
    return params


def network_timeouts(lease_ttl_seconds: float) -> dict[str, int]:
    """libpq settings that turn a silent network partition into an error
    within a third of the lease TTL (issue 17 part 2). Without them a
    statement on a link that drops packets waits for the kernel's TCP
    retransmission limit (about 15 minutes): the worker's threads sat in
    their statements and only reconnected long after the link came back.
    ``tcp_user_timeout`` bounds data sent and not acknowledged (a running
    query sends nothing, so it is not cut short); keepalives find a dead peer
    under an idle connection (the LISTEN connection); ``connect_timeout``
    bounds a connect to an unreachable host. A project's own values in
    ``DATABASES[...]["OPTIONS"]`` win."""
    third = max(1.0, lease_ttl_seconds / 3)
    return {
        "connect_timeout": max(2, math.ceil(third)),
        "tcp_user_timeout": int(third * 1000),
        "keepalives": 1,
        "keepalives_idle": max(1, int(third)),
        "keepalives_interval": max(1, int(third / 3)),
        "keepalives_count": 3,
    }


def connect(
    alias: str = DEFAULT_DB_ALIAS, autocommit: bool = True, application_name: str = "shardq"
) -> psycopg.Connection[TupleRow]:
    """A worker connection: Django's parameters for ``alias``, and network
    timeouts tied to the lease TTL where the project sets none."""
    params = {**network_timeouts(get_config().lease_ttl_seconds), **connection_kwargs(alias)}
    try:
        return psycopg.connect(**params, autocommit=autocommit, application_name=application_name)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {one_line(exc)}") from exc


def client_pid(cursor: psycopg.Cursor[Any], identity: bool = True) -> int | None:
    """The backend pid this connection was told at connect time (None:
    ``identity`` off). Through a pooler it is the pooler's, not the
    server's: ``backend_identity`` (worker.sql) then records nothing."""
    return cursor.connection.info.backend_pid if identity else None


def one_line(exc: BaseException) -> str:
    """The driver's message on one line (libpq's has a newline and a tab in
    "Is the server running on that host ...?"): a log line stays one line."""
    return " ".join(str(exc).split())


def dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def is_connection_error(exc: Exception) -> bool:
    """The server is unreachable or went away (not a statement-level error
    such as a deadlock): only these count toward opening the circuit."""
    state: str | None = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57"))


# SQLSTATE classes that say nothing about the statement's data: the same
# statement may succeed when sent again (DESIGN §5, the connection domain).
TRANSIENT_CLASSES = ("08", "57", "53", "40", "58", "55")


def is_transient(exc: BaseException) -> bool:
    """Would sending the same statement again be worth it?

    SQLSTATE decides, not the exception class: psycopg maps 54000 "string too
    long" to OperationalError, yet that statement fails the same way forever.
    A client-side error with no SQLSTATE is transient only when it is about
    the connection (OperationalError, InterfaceError); a loader's DataError
    (a value psycopg cannot decode) is about the data."""
    state: str | None = getattr(exc, "sqlstate", None)
    if state is None:
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return state.startswith(TRANSIENT_CLASSES)


def listen_statement(channel: str) -> sql.Composed:
    """``LISTEN`` with the channel quoted as an identifier (never pasted)."""
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


def listen(conn: psycopg.Connection[Any], *channels: str) -> None:
    """Subscribe ``conn`` (a listener's own autocommit connection) to each
    channel, quoted as an identifier."""
    for channel in channels:
        conn.execute(listen_statement(channel))


def record_listener(conn: psycopg.Connection[Any], worker: str, identity: bool = True) -> None:
    """Dead-owner detection: record ``conn`` (a listener's LISTEN session)
    beside ``worker``'s lease session (``record_listener`` in worker.sql);
    ``identity`` False records nothing (detection off)."""
    conn.execute(
        QUERIES["record_listener"],
        {"worker": worker, "client_pid": conn.info.backend_pid if identity else None},
    )


class DatabaseGuard:
    """One circuit breaker for all of a worker's connections.

    When most recent database calls failed because the server is unreachable,
    calls are refused at once with ``DatabaseUnavailable`` ("database
    unavailable") and a single probe is let through after a backoff (0.5 s,
    doubling up to 5 s), instead of every service hammering a dead server.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.breaker = CircuitBreaker(
            failure_ratio=0.5, min_calls=3, window_seconds=10.0, base_backoff_seconds=0.5, max_backoff_seconds=5.0
        )
        self.lock = threading.Lock()

    def admit(self, what: str) -> None:
        now = self.clock()
        with self.lock:
            if self.breaker.allow(now):
                return
            retry_in = self.breaker.retry_in(now)
        raise DatabaseUnavailable(
            f"database unavailable (circuit open; next probe in {retry_in:.1f}s): {what} not sent"
        )

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


#: The columns ``start_jobs`` returns (shardq/db/sql/job.sql), in order.
START_COLUMNS = ("id", "attempts", "status_rank", "started_at", "last_attempted_at")

_NULL_SUCCESS = '"status":"SUCCESSFUL","delay":0.0,"return_value":null}'


def outcome_batch_json(outcomes: Iterable[OutcomeRef]) -> str:
    """The outcomes as one JSON array for ``jsonb_to_recordset``.

    Built by string formatting because the return values and errors already
    are JSON text: nothing is encoded twice. An absent key reads as SQL NULL.
    """
    parts = []
    for o in outcomes:
        log = o.log_json
        if (
            log is None
            and o.status == "SUCCESSFUL"
            and o.error_json is None
            and o.return_value_json == "null"
            and not o.delay
        ):
            # The usual ack (a task that returned None), formatted once.
            parts.append('{"id":%d,"fence":%d,"rank":%d,%s' % (o.id, o.fence, o.rank, _NULL_SUCCESS))  # noqa: UP031
            continue
        extra = ""
        if o.return_value_json is not None:
            extra += ',"return_value":' + o.return_value_json
        if o.error_json is not None:
            extra += ',"error":' + o.error_json
        if log is not None:
            # The attempt's per-job log entry, and the job's bound for the
            # SQL that keeps its attempts' logs within it.
            extra += ',"log":%s,"log_bytes":%d' % (log, o.log_bytes)  # noqa: UP031
        # %-formatting on purpose: %d renders any integral number as an integer.
        parts.append(
            '{"id":%d,"fence":%d,"rank":%d,"status":"%s","delay":%r%s}'  # noqa: UP031
            % (o.id, o.fence, o.rank, o.status, float(o.delay), extra)
        )
    return "[" + ",".join(parts) + "]"


class WorkerStore:
    """One psycopg connection (autocommit) and the worker statements run on it.

    Not shared between threads: each worker service (leaser, fetcher,
    completer) owns one. A broken connection is dropped and re-opened on the
    next call; the failed call raises ``DatabaseUnavailable``.
    """

    def __init__(
        self,
        alias: str = DEFAULT_DB_ALIAS,
        application_name: str = "shardq",
        guard: "DatabaseGuard | None" = None,
        synchronous_commit: bool = True,
        generic_plans: bool = False,
        ordered_walks: bool = False,
    ):
        self.alias = alias
        self.application_name = application_name
        self.guard = guard or DatabaseGuard()
        self.synchronous_commit = synchronous_commit
        # Plan each prepared statement once (``generic_plans`` in sql/session.sql):
        # for the connections whose statements are id-driven writes.
        self.generic_plans = generic_plans
        # No bitmap scans (``ordered_walks`` in sql/session.sql): for the claim
        # connections, whose walks must keep to the ready index's order.
        self.ordered_walks = ordered_walks
        self.conn: psycopg.Connection[TupleRow] | None = None
        # The cursor the hot statements reuse (``run(..., keep=True)``).
        self._kept: psycopg.Cursor[TupleRow] | None = None

    def _kept_cursor(self) -> psycopg.Cursor[TupleRow]:
        """One tuple-row cursor kept on the current connection for the
        statements on every job's path (the start write, the ack): building
        a cursor (and its adapters map) per statement was a visible share of
        a no-op job's CPU. A store is one thread's at a time (above)."""
        kept = self._kept
        if kept is None or kept.closed or self.conn is None or self.conn.closed or kept.connection is not self.conn:
            kept = self._kept = self._cursor()
        return kept

    def _cursor(
        self, named: bool = False, row_factory: RowFactory[Any] | None = None, raw: bool = False
    ) -> psycopg.Cursor[Any]:
        """A cursor on this store's connection (opened when needed); ``raw``:
        a ``RawCursor``, for the statements in ``RAW_QUERIES``."""
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.alias, application_name=self.application_name)
            if not self.synchronous_commit:
                self.conn.execute(QUERIES["async_commit"])
            if self.generic_plans:
                self.conn.execute(QUERIES["generic_plans"])
            if self.ordered_walks:
                self.conn.execute(QUERIES["ordered_walks"])
        factory = row_factory if row_factory is not None else dict_row if named else None
        if raw:
            return psycopg.RawCursor(self.conn, row_factory=factory or tuple_row)
        return self.conn.cursor(row_factory=factory) if factory is not None else self.conn.cursor()

    @overload
    def run(
        self,
        name: str,
        params: Mapping[str, Any],
        fetch: Literal["all"] = "all",
        binary: bool = False,
        named: Literal[False] = False,
        keep: bool = False,
    ) -> list[TupleRow]: ...
    @overload
    def run(
        self,
        name: str,
        params: Mapping[str, Any],
        fetch: Literal["all"] = "all",
        binary: bool = False,
        *,
        named: Literal[True],
        keep: bool = False,
    ) -> list[NamedRow]: ...
    @overload
    def run(
        self,
        name: str,
        params: Mapping[str, Any],
        fetch: Literal["one"],
        binary: bool = False,
        named: Literal[False] = False,
        keep: bool = False,
    ) -> TupleRow | None: ...
    @overload
    def run(
        self,
        name: str,
        params: Mapping[str, Any],
        fetch: Literal["none"],
        binary: bool = False,
        named: bool = False,
        keep: bool = False,
    ) -> int: ...
    def run(
        self,
        name: str,
        params: Mapping[str, Any],
        fetch: Fetch = "all",
        binary: bool = False,
        named: bool = False,
        keep: bool = False,
    ) -> Any:
        """Run one named statement; rows as dicts when ``named``; ``keep``:
        on the kept cursor (tuple rows, not a RAW_QUERIES statement)."""
        return self.guarded(
            name,
            lambda cursor: self._execute(cursor, name, params, fetch, binary),
            named=named,
            raw=name in RAW_QUERIES,
            keep=keep,
        )

    @overload
    @staticmethod
    def _execute(
        cursor: psycopg.Cursor[Any],
        name: str,
        params: Mapping[str, Any],
        fetch: Literal["all"] = "all",
        binary: bool = False,
    ) -> list[Any]: ...
    @overload
    @staticmethod
    def _execute(
        cursor: psycopg.Cursor[Any],
        name: str,
        params: Mapping[str, Any],
        fetch: Literal["one", "none"],
        binary: bool = False,
    ) -> Any: ...
    @staticmethod
    def _execute(
        cursor: psycopg.Cursor[Any], name: str, params: Mapping[str, Any], fetch: Fetch = "all", binary: bool = False
    ) -> Any:
        if isinstance(cursor, psycopg.RawCursor):
            # Sent as it is (see RAW_QUERIES): a long statement, or a short
            # one in the same transaction as one (claim_limited).
            form = RAW_QUERIES.get(name) or _raw_forms.get(name)
            if form is None:
                form = _raw_forms[name] = raw_form(QUERIES[name])
            text, names = form
            cursor.execute(text, [params[n] for n in names], prepare=True, binary=binary)
        else:
            # (A long statement on a plain cursor works too, parsed each time.)
            cursor.execute(QUERIES[name], params, prepare=True, binary=binary)
        if fetch == "all":
            return cursor.fetchall()
        if fetch == "one":
            return cursor.fetchone()
        return cursor.rowcount

    def guarded[R](
        self,
        what: str,
        work: Callable[[psycopg.Cursor[Any]], R],
        named: bool = False,
        row_factory: RowFactory[Any] | None = None,
        raw: bool = False,
        keep: bool = False,
    ) -> R:
        """Run ``work(cursor)`` behind the circuit breaker, translating driver
        errors into their domain: ``DatabaseUnavailable`` (connection) or
        ``StatementRejected`` (the statement's data). ``raw``: the statement
        is one of ``RAW_QUERIES`` (``_execute`` sends it on a RawCursor);
        ``keep``: on the kept cursor (``_kept_cursor``)."""
        self.guard.admit(what)
        try:
            if keep:
                assert not (named or row_factory or raw), "the kept cursor has tuple rows and a plain cursor"
                result = work(self._kept_cursor())
            else:
                with self._cursor(named, row_factory, raw) as cursor:
                    result = work(cursor)
        except DatabaseUnavailable:
            self.guard.failed()
            raise
        except psycopg.Error as exc:
            raise self._translated(what, exc) from exc
        self.guard.succeeded()
        return result

    def _translated(self, what: str, exc: psycopg.Error) -> StatementRejected | DatabaseUnavailable:
        """The error domain of a driver error (the module docstring), with the
        guard and the connection brought up to date."""
        if not is_transient(exc):
            # The server answered: the connection is fine (autocommit, or
            # the transaction block rolled back).
            self.guard.succeeded()
            if self.conn is not None and self.conn.broken:
                self.close()
            # Before migrate: one clear sentence, not the statement's text.
            return tables_missing(exc) or StatementRejected(f"{what}: {exc}".strip(), getattr(exc, "sqlstate", None))
        if is_connection_error(exc) or self.conn is None or self.conn.broken:
            self.guard.failed()
        self.close()
        return DatabaseUnavailable(f"{what}: {one_line(exc)}")

    def run_split[I, R](
        self, items: list[I], run_batch: Callable[[list[I]], Iterable[R]]
    ) -> tuple[list[R], list[tuple[I, StatementRejected]]]:
        """``run_batch(items)`` (returning a list of rows), split in halves on
        ``StatementRejected`` until the bad items are alone: returns (rows of
        the batches that ran, [(item, StatementRejected)] of the ones that
        could not). ``DatabaseUnavailable`` propagates: that batch is sent again
        whole."""
        try:
            return list(run_batch(items)), []
        except StatementRejected as exc:
            if len(items) == 1:
                return [], [(items[0], exc)]
        middle = len(items) // 2
        rows, rejected = self.run_split(items[:middle], run_batch)
        more_rows, more_rejected = self.run_split(items[middle:], run_batch)
        return rows + more_rows, rejected + more_rejected

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # closing a broken connection may fail; it is gone either way
                pass
            self.conn = None
        self._kept = None

    # -- leases ---------------------------------------------------------------

    def check_tables(self) -> None:
        """Raise ``TablesMissing`` when the tables a worker uses are not
        there (manage.py migrate not run): shardq_worker asks before it
        starts any process."""
        self.run("tables_present", {}, fetch="none")

    def register_worker(
        self,
        worker: str,
        host: str,
        pid: int,
        queues: list[str],
        name: str | None = None,
        *,
        pool: str = pools.ALL,
        shard_count: int | None = None,
        identity: bool = True,
    ) -> None:
        """Register this incarnation in ``pool`` and make sure the pool's
        lease rows exist (a new pool's first worker creates them;
        ``shard_count`` defaults to SHARDQ["SHARD_COUNT"]). ``identity``:
        record this connection's server session for dead-owner detection
        (``backend_identity`` in worker.sql; False: detection off here)."""
        if shard_count is None:
            shard_count = get_config().shard_count

        def work(cursor: psycopg.Cursor[TupleRow]) -> None:
            with cursor.connection.transaction():
                self._execute(cursor, "ensure_shards", {"pool": pool, "count": shard_count}, fetch="none")
                self._execute(
                    cursor,
                    "register_worker",
                    {
                        "worker": worker,
                        "host": host,
                        "pid": pid,
                        "queues": dumps(queues),
                        "name": name or "",
                        "pool": pool,
                        "client_pid": client_pid(cursor, identity),
                    },
                    fetch="none",
                )

        self.guarded("register_worker", work)

    def heartbeat(
        self, worker: str, stats: Mapping[str, object], ttl: float, pool: str = pools.ALL, now: datetime | None = None
    ) -> list[str]:
        """Record the heartbeat; the live workers of ``pool``, in start order
        (``now``: the time it is taken at, None: the database's clock)."""
        return self.beat(worker, stats, ttl, pool, now)[0]

    def beat(
        self,
        worker: str,
        stats: Mapping[str, object],
        ttl: float,
        pool: str = pools.ALL,
        now: datetime | None = None,
        *,
        dead: Iterable[str] = (),
        identity: bool = True,
    ) -> tuple[list[str], int | None]:
        """``heartbeat``, and the cluster's shard count (None: unknown).
        ``dead``: workers the dead-owner check found gone (not counted live
        while their session is still gone); ``identity``: record this
        connection's server session (``register_worker``)."""
        dead = list(dead)

        def work(cursor: psycopg.Cursor[TupleRow]) -> list[TupleRow]:
            params = {
                "worker": worker,
                "stats": dumps(stats),
                "ttl": ttl,
                "pool": pool,
                "now": now,
                "dead": dead,
                "client_pid": client_pid(cursor, identity),
            }
            return self._execute(cursor, "heartbeat", params)

        rows = self.guarded("heartbeat", work, raw="heartbeat" in RAW_QUERIES)
        return [str(row[0]) for row in rows], (rows[0][2] if rows else None)

    def dead_owners(self, worker: str, ttl: float, pool: str = pools.ALL) -> list[tuple[str, int, bool, bool]]:
        """Dead-owner detection's check: the other workers of ``pool``
        (heartbeat within ``ttl``) whose lease session is gone from this
        server: (worker id, recorded backend pid, holds a live lease, its
        LISTEN session is recorded and gone too)."""
        rows = self.run("dead_owners", {"worker": worker, "ttl": ttl, "pool": pool})
        return [(str(w), int(pid), bool(holds), bool(whole)) for w, pid, holds, whole in rows]

    def claim_shards(
        self,
        worker: str,
        wanted: int,
        ttl: float,
        shard_count: int,
        max_worker_losses: int,
        pool: str = pools.ALL,
        now: datetime | None = None,
        *,
        dead: Iterable[str] = (),
    ) -> list[NamedRow]:
        """Take up to ``wanted`` free or expired shards of ``pool``, rescue
        the jobs their previous owners left in flight and log each claim: one
        transaction. Rows: shard, claim_version, previous_owner, rescued.
        ``now``: the time leases are read and written at (None: the
        database's clock; a test jumps past a lease's end with it).
        ``dead``: workers the dead-owner check found gone; their shards are
        taken as expired ones while their session is still gone."""
        dead = list(dead)

        def work(cursor: psycopg.Cursor[NamedRow]) -> list[NamedRow]:
            taken = self._execute(
                cursor,
                "claim_shards",
                {
                    "worker": worker,
                    "wanted": wanted,
                    "ttl": ttl,
                    "shard_count": shard_count,
                    "pool": pool,
                    "now": now,
                    "dead": dead,
                },
            )
            if not taken:
                return []
            taken.sort(key=lambda row: row["shard"])
            pairs = {row["shard"]: row["claim_version"] for row in taken}
            rescued = Counter(
                row["shard"]
                for row in self._execute(
                    cursor,
                    "rescue_jobs",
                    {
                        "shards": list(pairs),
                        "versions": list(pairs.values()),
                        "max_worker_losses": max_worker_losses,
                        "ttl": ttl,
                        "now": now,
                    },
                )
            )
            self._execute(
                cursor,
                "log_shard_claims",
                {
                    "worker": worker,
                    "pool": pool,
                    "shards": list(pairs),
                    "versions": list(pairs.values()),
                    "previous": [row["previous_owner"] for row in taken],
                    "rescued": [rescued[row["shard"]] for row in taken],
                },
                fetch="none",
            )
            return [{**row, "rescued": rescued[row["shard"]]} for row in taken]

        def in_transaction(cursor: psycopg.Cursor[NamedRow]) -> list[NamedRow]:
            # Pipelined: BEGIN goes out with the claim and the log with the
            # COMMIT, three round trips instead of five. This transaction is
            # what ends a released shard's time without an owner when a
            # worker joins (issue 13: under load each round trip costs tens
            # of milliseconds).
            with cursor.connection.pipeline(), cursor.connection.transaction():
                return work(cursor)

        return self.guarded("claim_shards", in_transaction, named=True)

    def renew_leases(
        self, worker: str, held: dict[int, int], ttl: float, pool: str = pools.ALL, now: datetime | None = None
    ) -> set[int]:
        shards = list(held)
        rows = self.run(
            "renew_leases",
            {
                "worker": worker,
                "ttl": ttl,
                "shards": shards,
                "versions": [held[s] for s in shards],
                "pool": pool,
                "now": now,
            },
        )
        return {row[0] for row in rows}

    def release_shards(
        self, worker: str, pairs: dict[int, int], pool: str = pools.ALL, channel: str = LEASE_CHANNEL
    ) -> set[int]:
        """Release ``pairs`` and, in the same statement, NOTIFY ``channel``
        (the lease channel) when any was released."""
        shards = list(pairs)
        rows = self.run(
            "release_shards",
            {
                "worker": worker,
                "shards": shards,
                "versions": [pairs[s] for s in shards],
                "pool": pool,
                "channel": channel,
            },
        )
        return {row[0] for row in rows}

    def stop_worker(self, worker: str, stats: Mapping[str, object]) -> None:
        self.run("stop_worker", {"worker": worker, "stats": dumps(stats)}, fetch="none")

    def notify(self, channel: str, payload: str) -> None:
        self.run("notify", {"channel": channel, "payload": payload}, fetch="none")

    # -- metrics --------------------------------------------------------------

    def metrics_lock(self) -> bool:
        """Does this connection hold (now, or newly) the cluster-metrics lock?"""
        row = self.run("metrics_lock", {"classid": METRICS_LOCK[0], "objid": METRICS_LOCK[1]}, fetch="one")
        return bool(row and row[0])

    def cluster_metrics(self, ttl: float, shard_count: int) -> tuple[list[NamedRow], int]:
        """(``metrics_jobs`` rows, unowned shards of live pools)."""
        rows = self.run("metrics_jobs", {}, named=True)
        unowned = self.run("metrics_unowned_shards", {"ttl": ttl, "shard_count": shard_count}, fetch="one")
        return rows, int(unowned[0]) if unowned else 0

    def fair_keys(self) -> list[TupleRow]:
        """``status_fair_keys`` rows: per queue and fair key, its backlog and
        last minute (docs/fairness.md; ``shardq.fairness.summarize_fair_keys``)."""
        return self.run("status_fair_keys", {})

    # -- history (shardq_job_history; docs/architecture.md, "History") -------------

    def archiver_lock(self) -> bool:
        """Does this connection hold (now, or newly) the archiver's lock?"""
        row = self.run("metrics_lock", {"classid": ARCHIVER_LOCK[0], "objid": ARCHIVER_LOCK[1]}, fetch="one")
        return bool(row and row[0])

    def archive_jobs(self, grace_seconds: float, batch: int, floor: Any, ceiling: Any) -> tuple[int, int]:
        """Move up to ``batch`` finished jobs to history (``archive_jobs``):
        (jobs that left shardq_job, jobs written to history; the rest were
        past the retention)."""
        row = self.run(
            "archive_jobs", {"grace": grace_seconds, "batch": batch, "floor": floor, "ceiling": ceiling}, fetch="one"
        )
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def history_partitions(self) -> list[NamedRow]:
        return self.run("history_partitions", {}, named=True)

    def maintain_history(
        self, keep_seconds: float, width_seconds: int, ahead_seconds: float, lock_timeout_ms: int = 2000
    ) -> tuple[list[str], list[str]]:
        """Create the partitions missing from ``keep_seconds`` ago to
        ``ahead_seconds`` ahead, and drop the ones wholly past ``keep_seconds``
        (DETACH ... CONCURRENTLY, then DROP TABLE). Returns (created, dropped)
        statements/names. DDL waits at most ``lock_timeout_ms`` for a lock
        (a refusal is retried at the next pass)."""
        self.run("set_lock_timeout", {"ms": str(lock_timeout_ms)}, fetch="none")
        created = [
            row[0]
            for row in self.run(
                "history_create_partitions", {"keep": keep_seconds, "width": width_seconds, "ahead": ahead_seconds}
            )
        ]
        for ddl in created:
            self._run_generated("history partition", ddl)
        dropped = []
        for name, detach, drop in self.run("history_expired_partitions", {"keep": keep_seconds}):
            self._run_generated("history detach", detach)
            self._run_generated("history drop", drop)
            dropped.append(name)
        return created, dropped

    def _run_generated(self, what: str, text: str) -> None:
        """Run a statement a named block generated (partition DDL: its names
        and bounds come from the database's own format(), never from input)."""
        self.guarded(what, lambda cursor: cursor.execute(text.encode()))

    # -- jobs -----------------------------------------------------------------

    def claim_jobs(
        self,
        worker: str,
        shards: list[int],
        queues: list[str] | None,
        per_shard: int,
        limit: int,
        lookahead: float = 0.0,
        row_factory: "type[DataclassInstance] | None" = None,
        exclude_queues: list[str] | None = None,
        backend: str | None = None,
        pool: str = pools.ALL,
        min_priority: int = ANY_PRIORITY,
        full_keys: list[tuple[str, str]] | None = None,
        now: datetime | None = None,
        fair_after: str = "",
        full_fair_keys: list[str] | None = None,
        fair_walk: bool = True,
        fair_weights: dict[str, float] | None = None,
    ) -> list[Any]:
        """Claim a batch of the highest priority level due (rows by name:
        dicts, or ``row_factory(**columns)``; a row with ``problem`` set was
        quarantined, not claimed; every other one is CLAIMED, never started:
        its thread's start write starts it, see sql/job.sql). Only jobs of priority ``min_priority``
        or more are taken; key_limited jobs of ``full_keys`` ((task path,
        shard key) pairs whose gate in the local queue has jobs waiting)
        are passed over.
        ``now``: the time leases and due times are read at (None: the
        database's clock). Jobs with a fair key are taken key by key
        (docs/fairness.md): one round over the keys of every shard in
        ``shards``, the keys after ``fair_after`` first (byte order),
        passing over ``full_fair_keys``, the batch shared out by
        ``fair_weights`` (key -> weight; 1 for a key not named)."""
        params = {
            **claim_scope(worker, shards, pool, queues, exclude_queues, backend, per_shard, now),
            **claim_jobs_params(
                limit, lookahead, min_priority, full_keys, fair_after, full_fair_keys, fair_walk, fair_weights
            ),
        }
        # Binary results: timestamps and numbers decode without parsing text.
        if row_factory is None:
            return self.run("claim_jobs", params, binary=True, named=True)
        return self.guarded(
            "claim_jobs",
            lambda cursor: self._execute(cursor, "claim_jobs", params, binary=True),
            row_factory=fields_row(row_factory),
            raw="claim_jobs" in RAW_QUERIES,
        )

    # -- limits (docs/limits.md; the decisions are shardq/worker/limits.py's) --

    @contextlib.contextmanager
    def limited_claim(self, now: datetime | None = None) -> Iterator["LimitedClaim"]:
        """One transaction for the statements of a limited claim (the worker's
        ``Limiter.claim`` decides between them): committed when the block
        ends, rolled back when it raises. Driver errors are translated as
        ``guarded`` does. ``now``: the time its statements read leases, due
        times and tokens at (None: the database's clock)."""
        what = "claim_limited_jobs"
        self.guard.admit(what)
        try:
            with self._cursor() as cursor:
                conn = cursor.connection
                # A cursor per row shape: psycopg applies a new row_factory to
                # the current result at once, so one cursor cannot change shapes.
                with conn.transaction(), conn.cursor(row_factory=dict_row) as named:
                    yield LimitedClaim(cursor, named, now)
        except DatabaseUnavailable:
            self.guard.failed()
            raise
        except psycopg.Error as exc:
            raise self._translated(what, exc) from exc
        self.guard.succeeded()

    def claim_limited_owned(
        self,
        *,
        worker: str,
        shards: list[int],
        pool: str,
        queues: list[str] | None,
        exclude_queues: list[str] | None,
        backend: str | None,
        per_shard: int,
        rooms: dict[str, int],
        limit: int,
        row_factory: "type[DataclassInstance]",
        now: datetime | None = None,
    ) -> list[Any]:
        """The limited claim of jobs whose every limit has room in the
        slots this worker owns (``rooms``: key -> jobs it may still claim):
        one statement, no transaction of its own (``claim_limited_owned``).
        Its jobs are CLAIMED, started by their threads."""
        keys = list(rooms)
        params = {
            **claim_scope(worker, shards, pool, queues, exclude_queues, backend, per_shard, now),
            "keys_json": Jsonb(keys),
            "keys": keys,
            "rooms": list(rooms.values()),
            "limit": limit,
        }
        return self.guarded(
            "claim_limited_owned",
            lambda cursor: self._execute(cursor, "claim_limited_owned", params, binary=True),
            row_factory=fields_row(row_factory),
            raw="claim_limited_owned" in RAW_QUERIES,
        )

    def release_limit_slots(self, worker: str, slots: list[int], channel: str) -> None:
        """Give back this worker's ``slots`` and NOTIFY each freed key on ``channel``."""
        self.run("release_limit_slots", {"worker": worker, "slots": slots, "channel": channel})

    def renew_limit_slots(self, worker: str, slots: list[int], ttl: float, now: datetime | None = None) -> int:
        """Extend ``slots`` by ``ttl``; give back this worker's others. Returns how many were kept."""
        return len(self.run("renew_limit_slots", {"worker": worker, "slots": slots, "ttl": ttl, "now": now}))

    def start_jobs[J: JobRef](
        self, worker: str, jobs: list[J]
    ) -> tuple[dict[int, NamedRow], list[tuple[J, StatementRejected]]]:
        """Record the real start of claimed jobs (objects with id, fence,
        status_rank) in one statement. Returns ({id: row} of the jobs started,
        the row's columns by name: ``START_COLUMNS``; [(job, StatementRejected)]
        of rows PostgreSQL refused). A job missing from both lost its claim:
        it must not start."""

        def batch(part: list[J]) -> list[TupleRow]:
            return self.run(
                "start_jobs",
                {
                    "worker": worker,
                    # Array literals: psycopg's list dumper costs a Python call
                    # per element (as in complete_jobs), on every job's path.
                    "ids": "{" + ",".join([str(j.id) for j in part]) + "}",
                    "fences": "{" + ",".join([str(j.fence) for j in part]) + "}",
                    "ranks": "{" + ",".join([str(j.status_rank) for j in part]) + "}",
                },
                # Binary results: the times decode without parsing text
                # (a start write per group of threads is on every job's path).
                binary=True,
                keep=True,
            )

        rows, rejected = self.run_split(jobs, batch)
        return {row[0]: dict(zip(START_COLUMNS, row, strict=True)) for row in rows}, rejected

    def complete_and_start_jobs[J: JobRef, O: OutcomeRef](
        self, worker: str, jobs: list[J], outcomes: list[O], now: datetime | None = None
    ) -> tuple[dict[int, NamedRow], set[tuple[int, int]], set[int]]:
        """``complete_jobs(outcomes)`` and ``start_jobs(worker, jobs)`` in one
        statement (the acks ride on the start write): ({id: row} of the jobs
        started, as ``start_jobs`` gives them; the (id, rank) pairs of the
        outcomes written; the ids among those of workflow parents with
        children pending). Not split: a ``StatementRejected`` (an outcome or
        a row PostgreSQL refused) is raised whole, and the caller sends each
        part on its own path, which splits."""
        rows = self.run(
            "complete_and_start_jobs",
            {
                "worker": worker,
                "ids": "{" + ",".join([str(j.id) for j in jobs]) + "}",
                "fences": "{" + ",".join([str(j.fence) for j in jobs]) + "}",
                "ranks": "{" + ",".join([str(j.status_rank) for j in jobs]) + "}",
                "done_ids": "{" + ",".join([str(o.id) for o in outcomes]) + "}",
                "batch": outcome_batch_json(outcomes),
                "now": now,
            },
            binary=True,
            keep=True,
        )
        started: dict[int, NamedRow] = {}
        applied: set[tuple[int, int]] = set()
        parents: set[int] = set()
        for is_start, job_id, attempts, rank, started_at, last_attempted_at, pending in rows:
            if is_start:
                started[job_id] = {
                    "id": job_id,
                    "attempts": attempts,
                    "status_rank": rank,
                    "started_at": started_at,
                    "last_attempted_at": last_attempted_at,
                }
            else:
                applied.add((job_id, rank))
                if pending:
                    parents.add(job_id)
        return started, applied, parents

    def flush_commits(self) -> None:
        """A synchronous commit (``flush_commits``): the WAL is flushed past
        every commit made before it (this connection must commit
        synchronously: the completer's does)."""
        self.run("flush_commits", {}, fetch="none")

    def resolve_children(
        self, shards: list[int], batch: int, channel: str, notify: bool = True
    ) -> tuple[int, list[NamedRow]]:
        """One pass of the workflow resolver over ``shards`` (see
        ``resolve_children`` in sql/workflow.sql): (parents resolved, children moved)."""
        rows = self.run(
            "resolve_children",
            {"shards": shards, "batch": batch, "channel": channel, "notify": notify},
            named=True,
        )
        parents = int(rows[0]["parents"]) if rows else 0
        return parents, [row for row in rows if row["id"] is not None]

    def my_claimed_jobs(self, worker: str, shards: list[int]) -> list[NamedRow]:
        return self.run("my_claimed_jobs", {"worker": worker, "shards": shards}, named=True)

    def cancelled_attempts(self, attempts: Sequence[tuple[int, int]]) -> set[int]:
        """The ids among these (id, rank) running attempts whose job was cancelled."""
        rows = self.run("cancelled_attempts", {"ids": [a[0] for a in attempts], "ranks": [a[1] for a in attempts]})
        return {row[0] for row in rows}

    def return_lost_starts(self, outcomes: Sequence[OutcomeRef]) -> set[int]:
        """Of these refused outcomes, the jobs whose start write was lost
        (CLAIMED at the claim's rank under the claim's fence): back to
        READY to run again (``return_lost_starts`` in sql/job.sql); their ids."""
        rows = self.run(
            "return_lost_starts",
            {
                "ids": [o.id for o in outcomes],
                "fences": [o.fence for o in outcomes],
                "ranks": [o.rank for o in outcomes],
            },
        )
        return {row[0] for row in rows}

    def history_gauges(self) -> TupleRow | None:
        """(estimated rows, partitions, seconds since the oldest partition's
        start or None) of shardq_job_history; None when it does not exist."""
        present = self.run("history_present", {}, fetch="one")
        if not (present and present[0]):
            return None
        return self.run("history_gauges", {}, fetch="one")

    def queue_controls(self) -> list[TupleRow]:
        """Every queue paused or with a concurrency override: (queue_name,
        paused, concurrency) rows (shardq/queues.py)."""
        return self.run("queue_controls", {})

    def seconds_until_due(self, shards: list[int], now: datetime | None = None) -> float | None:
        """Seconds from ``now`` (None: the database's clock) until the next
        deferred READY job of ``shards`` falls due; None: there is none."""
        row = self.run("seconds_until_due", {"shards": shards, "now": now}, fetch="one")
        seconds: float | None = row[0] if row else None
        return seconds

    def rescue_jobs(
        self, held: dict[int, int], max_worker_losses: int, ttl: float | None = None, now: datetime | None = None
    ) -> list[NamedRow]:
        """The one rescue (see ``rescue_jobs`` in sql/job.sql) over the
        (shard, claim_version) pairs ``held``: rows shard, id, started, dead."""
        shards = sorted(held)
        if ttl is None:
            ttl = get_config().lease_ttl_seconds
        return self.run(
            "rescue_jobs",
            {
                "shards": shards,
                "versions": [held[s] for s in shards],
                "max_worker_losses": max_worker_losses,
                "ttl": ttl,
                "now": now,
            },
            named=True,
        )

    def complete_jobs[O: OutcomeRef](
        self, outcomes: list[O], parents: set[int] | None = None, now: datetime | None = None
    ) -> tuple[set[tuple[int, int]], list[tuple[O, StatementRejected]]]:
        """Write outcomes (objects with id, fence, rank, status, return_value_json,
        error_json, delay) in one statement; returns the (id, rank) pairs
        written and [(outcome, StatementRejected)] of those PostgreSQL refused
        (the rest of the batch is written: the batch is split around them).
        The ids of written jobs that are workflow parents with children
        still pending are added to ``parents`` when given (the resolver's
        work: the completer wakes it only then).

        Pairs, not ids: one batch may hold two outcomes of a job (a rejected
        one and the one written again under a later claim, see
        ``Completer.recall``), and only one of them can land. A retry is due
        its delay after ``now`` (None: the database's clock)."""

        def batch(part: list[O]) -> list[TupleRow]:
            # The ids as one array literal: psycopg's list dumper costs a Python
            # call per element, a tenth of the completer's time at no-op rates.
            ids = "{" + ",".join([str(o.id) for o in part]) + "}"
            return self.run("complete_jobs", {"ids": ids, "batch": outcome_batch_json(part), "now": now}, keep=True)

        rows, rejected = self.run_split(outcomes, batch)
        if parents is not None:
            parents.update(job_id for job_id, _rank, pending in rows if pending)
        return {(job_id, rank) for job_id, rank, _pending in rows}, rejected

    def outcomes_applied(self, outcomes: Sequence[OutcomeRef]) -> set[tuple[int, int]]:
        rows = self.run(
            "outcomes_applied",
            {
                "ids": [o.id for o in outcomes],
                "fences": [o.fence for o in outcomes],
                "ranks": [o.rank for o in outcomes],
            },
        )
        return {(job_id, rank) for job_id, rank in rows}

    def return_jobs(self, jobs: Sequence[JobRef]) -> set[int]:
        """Put claimed jobs that never ran here back to READY (objects with id,
        fence, status_rank, and ``started``/``previous_attempt_at`` when the
        claim started them)."""
        rows = self.run(
            "return_jobs",
            {
                "ids": [j.id for j in jobs],
                "fences": [j.fence for j in jobs],
                "ranks": [j.status_rank + 1 for j in jobs],
                "started": [bool(getattr(j, "started", False)) for j in jobs],
                "previous_attempt_at": [getattr(j, "previous_attempt_at", None) for j in jobs],
            },
        )
        return {row[0] for row in rows}

    def defer_unknown_jobs(self, jobs: Sequence[JobRef], delay: float, timeout: float) -> list[tuple[int, bool]]:
        """Claimed jobs whose task path this worker cannot resolve: back to
        READY, due in ``delay`` seconds, no attempt used; FAILED once no
        worker could resolve them for ``timeout`` seconds. Returns (id,
        dead-lettered) for each job written."""
        rows = self.run(
            "defer_unknown_jobs",
            {
                "ids": [j.id for j in jobs],
                "fences": [j.fence for j in jobs],
                "ranks": [j.status_rank + 1 for j in jobs],
                "started": [bool(getattr(j, "started", False)) for j in jobs],
                "previous_attempt_at": [getattr(j, "previous_attempt_at", None) for j in jobs],
                "delay": delay,
                "timeout": timeout,
            },
        )
        return [(row[0], row[2]) for row in rows]


class LimitedClaim:
    """The statements of one limited claim (docs/limits.md), run in the
    transaction ``WorkerStore.limited_claim`` opened. Plain values in,
    rows out: which of them run, and what they take, is the worker's
    decision (``shardq/worker/limits.py``)."""

    def __init__(
        self, cursor: psycopg.Cursor[TupleRow], named: psycopg.Cursor[NamedRow], now: datetime | None = None
    ) -> None:
        self.cursor = cursor
        self.named = named
        # The time every statement of the claim reads (None: the database's clock).
        self.now = now

    @staticmethod
    def _execute(cursor: psycopg.Cursor[Any], name: str, params: Mapping[str, Any], **kwargs: Any) -> Any:
        """``WorkerStore._execute`` on ``cursor``, or on a RawCursor of its
        connection and row factory for a statement of ``RAW_QUERIES``."""
        if name not in RAW_QUERIES:
            return WorkerStore._execute(cursor, name, params, **kwargs)
        with psycopg.RawCursor(cursor.connection, row_factory=cursor.row_factory) as raw:
            return WorkerStore._execute(raw, name, params, **kwargs)

    def candidates(
        self,
        *,
        worker: str,
        shards: list[int],
        pool: str,
        queues: list[str] | None,
        exclude_queues: list[str] | None,
        backend: str | None,
        per_shard: int,
        scan: int,
        full: list[str],
    ) -> list[NamedRow]:
        """Lock up to ``scan`` due READY limited jobs (``claim_limited_candidates``),
        passing over those with a key in ``full``."""
        params = {
            **claim_scope(worker, shards, pool, queues, exclude_queues, backend, per_shard, self.now),
            "scan": scan,
            "full": full,
        }
        rows: list[NamedRow] = self._execute(self.named, "claim_limited_candidates", params, binary=True)
        return rows

    def ensure_slots(self, caps: Mapping[str, int]) -> None:
        """Make sure the slot rows of each key exist, ``caps[key]`` of them."""
        params = {"keys": list(caps), "caps": list(caps.values())}
        self._execute(self.cursor, "ensure_limit_slots", params, fetch="none")

    def ensure_rates(self, keys: list[str]) -> None:
        """Make sure the GCRA row of each rate key exists."""
        self._execute(self.cursor, "ensure_limit_rates", {"keys": keys}, fetch="none")

    def take_slots(self, wanted: Mapping[str, tuple[int, int]]) -> list[tuple[str, int]]:
        """Lock free slot rows (SKIP LOCKED): ``wanted``, key -> (cap, how
        many), sorted by key. Returns (key, slot id) rows."""
        params = {
            "keys": list(wanted),
            "caps": [cap for cap, _ in wanted.values()],
            "wanted": [n for _, n in wanted.values()],
            "now": self.now,
        }
        rows: list[tuple[str, int]] = self._execute(self.cursor, "take_limit_slots", params)
        return rows

    def lock_rates(self, keys: list[str]) -> list[NamedRow]:
        """Lock the GCRA rows of ``keys`` (sorted: the lock order); rows
        limit_key, tat, now."""
        rows: list[NamedRow] = self._execute(self.named, "lock_limit_rates", {"keys": keys, "now": self.now})
        return rows

    def claim[R: "DataclassInstance"](
        self,
        *,
        worker: str,
        pool: str,
        ids: list[int],
        start_ids: list[int],
        problems: list[str | None],
        slot_ids: list[int],
        rate_keys: list[str],
        rate_tats: list[float],
        ttl: float,
        row_factory: type[R],
    ) -> list[R]:
        """Write the slots (owned by ``worker`` for ``ttl``), the rate rows'
        new TATs and the claims of ``ids`` in one statement, the first
        ``start_ids`` started; a job with a ``problems`` entry (not None) is
        quarantined instead (``claim_limited_jobs``)."""
        params = {
            "worker": worker,
            "pool": pool,
            "ids": ids,
            "start_ids": start_ids,
            "problems": problems,
            "slot_ids": slot_ids,
            "rate_keys": rate_keys,
            "rate_tats": rate_tats,
            "ttl": ttl,
            "now": self.now,
        }
        with self.cursor.connection.cursor(row_factory=fields_row(row_factory)) as jobs:
            claimed: list[R] = self._execute(jobs, "claim_limited_jobs", params, binary=True)
        return claimed


def fields_row[R: "DataclassInstance"](cls: type[R]) -> RowFactory[R]:
    """A psycopg row factory building the dataclass ``cls`` from a row by
    name, at the cost of a positional call: the columns are matched to the
    fields once per result (a missing or unknown column raises), then each
    row is ``cls(*values)`` when they line up, else reordered. The claim's
    hundreds of rows per statement made ``kwargs_row``'s dict per row a
    measurable share of the worker's CPU."""
    fields = [f.name for f in dataclasses.fields(cls)]

    def factory(cursor: psycopg.Cursor[Any]) -> RowMaker[R]:
        names = [column.name for column in cursor.description or ()]
        unknown = set(names) - set(fields)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field for column(s) {sorted(unknown)}")
        if names == fields[: len(names)]:
            return lambda values: cls(*values)
        order = [names.index(name) for name in fields if name in names]
        trailing = [name for name in fields if name not in names]
        if any(fields.index(name) < len(order) for name in trailing):
            # A field without a column before the last column: by keyword.
            return lambda values: cls(**dict(zip(names, values, strict=False)))
        return lambda values: cls(*[values[i] for i in order])

    return factory
