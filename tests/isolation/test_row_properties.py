"""Property: whatever value a column of ``shardq_job`` holds, a worker stays
up and every other job is done (issue 24, DESIGN §5); and whatever lease
session a peer's ``shardq_worker`` row records (dead-owner detection), the
worker stays up and holds its shards.

Each example writes one value of a column's real SQL type (read from
``information_schema``: extremes of the integers, infinite and out-of-Python
timestamps, JSON of any shape, depth and size, empty and long text, NULL
where the column allows it) into an otherwise valid READY job — a plain one
or a limited one, so the ordinary claim, both limited claims and the idle
fetcher's ``seconds_until_due`` all read it; or RUNNING under a superseded
fence (the rescue reads it) or WAITING on a parent beside a sibling (the
resolver reads it) — beside valid jobs, plain and limited, which must all
succeed while every service of one in-process worker stays alive. The odd
job itself may run, fail, be quarantined or stay where it is (a shard,
status, queue or backend no claim serves).

Every example's rows are written while the worker runs, and the worker's
recovery (the valid jobs done, an idle round, two renewals, all shards held
again) is waited for once a batch of examples, not once an example: the
rows of a batch are in the table at once. ``make test`` runs a few dozen
examples in one batch; SHARDQ_FULL_FAULTS=1 (``make faults``) 30 a column.
"""

import json
import os
import uuid

import pytest
from django.db import DataError, IntegrityError
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import example as hypothesis_example
from hypothesis import strategies as st

import shardq
from tests.helpers import in_process_worker, job_factory, leased_shard_factory, sql, wait_until
from tests.taskapp import limit_tasks
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db(transaction=True)

FULL = bool(os.environ.get("SHARDQ_FULL_FAULTS"))
EXAMPLES_PER_COLUMN = 30 if FULL else 2
LIMITED_PATH = "tests.taskapp.limit_tasks.three_at_once"
LIMITED_KEYS = '["t:tests.taskapp.limit_tasks.three_at_once"]'

INT_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}


def columns() -> list[tuple[str, str, bool, int | None]]:
    """(name, SQL type, nullable, character length) of every column of shardq_job."""
    return sql(
        "SELECT column_name, data_type, is_nullable = 'YES', character_maximum_length "
        "FROM information_schema.columns WHERE table_name = 'shardq_job' ORDER BY ordinal_position"
    )


def integers(low: int, high: int) -> st.SearchStrategy[int]:
    # The ends (where arithmetic overflows), their neighbours, and the small
    # values a hand might write.
    return st.one_of(
        st.sampled_from([low, high]),
        st.sampled_from([low + 1, high - 1, -1, 0, 1, 2]),
        st.integers(low, high),
        st.integers(-300, 300),
    )


# Text PostgreSQL can store: no NUL, no lone surrogate (UTF-8).
CHARACTERS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")


def texts(max_size: int | None) -> st.SearchStrategy[str]:
    size = 2000 if max_size is None else max_size
    special = [
        *("", " ", "\x01\n", "default", "os.system", "tests.taskapp.tasks.noop", "tests.taskapp.broken_module.x"),
        *("tests.taskapp.tasks.", "tests..x", "READY", "CLAIMED", "RUNNING", "WAITING", "FAILED", "SUCCESSFUL"),
    ]
    return st.one_of(
        st.sampled_from([s for s in special if len(s) <= size]),
        st.text(CHARACTERS, max_size=min(size, 40)),
        st.text(CHARACTERS, min_size=size, max_size=size),  # as long as the type allows
    )


def timestamps() -> st.SearchStrategy[str]:
    """timestamptz literals: the infinities, PostgreSQL's ends, Python's
    ends and beyond, and ordinary times around now."""
    ends = [
        "infinity",
        "-infinity",
        "4713-01-01 00:00:00+00 BC",
        "294276-12-31 23:59:59+00",
        "0001-01-01 00:00:00+00",
        "0001-01-01 00:00:00+14",
        "9999-12-31 23:59:59.999999+00",
        "9999-12-31 23:59:59-14",
        "10000-01-01 00:00:00+00",
        "1970-01-01 00:00:00+00",
    ]
    return st.one_of(
        st.sampled_from(ends),
        st.builds(
            lambda y, s: f"{y:04d}-06-15 12:00:00+00 {'BC' if s else ''}".strip(), st.integers(1, 294276), st.booleans()
        ),
        st.integers(-3600, 3600).map(lambda s: f"now {'+' if s >= 0 else '-'} interval '{abs(s)} seconds'"),
    )


def json_texts() -> st.SearchStrategy[str]:
    """jsonb values as JSON text: any shape, deep nesting, huge numbers and wide containers."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(CHARACTERS, max_size=20),
    )
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(CHARACTERS, max_size=8), inner, max_size=5),
    )
    return st.one_of(
        values.map(json.dumps),
        st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),  # nesting up to PostgreSQL's own limits
        st.integers(1, 3000).map(lambda n: '{"a": ' * n + "1" + "}" * n),
        st.integers(1, 6000).map(lambda n: f"[{'9' * n}]"),  # integers up to and past Python's 4300 digits
        st.sampled_from(["[1e5000]", "[-1e400]", "1e400", '"x"', "[]", "{}", "null", "[1, 2]", '["a", "a"]']),
        st.integers(1, 20000).map(lambda n: json.dumps(["w"] * n)),  # wide
        st.integers(1, 200).map(lambda n: json.dumps([{"exception_class_path": "x" * n, "traceback": 7}])),
    )


def value_of(data_type: str, nullable: bool, length: int | None) -> st.SearchStrategy[str | None]:
    """SQL text for a value of ``data_type`` (cast by the UPDATE), or None (NULL)."""
    if data_type in INT_RANGES:
        base = integers(*INT_RANGES[data_type]).map(str)
    elif data_type == "boolean":
        base = st.sampled_from(["true", "false"])
    elif data_type in ("character varying", "text"):
        base = texts(length)
    elif data_type == "timestamp with time zone":
        base = timestamps()
    elif data_type == "jsonb":
        base = json_texts()
    else:
        raise AssertionError(f"shardq_job has a column of type {data_type}: give the property test its values")
    return st.one_of(st.none(), base) if nullable else base


# Where the odd rows are when the worker reads them (one of each a value):
# READY for the ordinary
# claim (and the idle fetcher), READY and limited for both limited claims,
# RUNNING under a superseded fence for the leaser's rescue, WAITING on a
# parent (beside a sibling) for the workflow resolver.
STATES = ("ready", "limited", "rescued", "waiting")


def write_odd_job(name: str, data_type: str, value: str | None, state: str, shard: int) -> tuple[int, list[int]]:
    """A valid job in ``state`` with column ``name`` then set to ``value``:
    (its id, the ids of the valid jobs written with it)."""
    others: list[int] = []
    if state == "waiting":
        wf = shardq.Workflow(name="odd")
        parent = wf.add(t.noop)
        wf.add(t.noop, after=[parent], step_name="odd")
        wf.add(t.noop, after=[parent], step_name="sibling")
        parent_id, job_id, sibling_id = (int(r.id) for r in wf.enqueue())
        others = [parent_id, sibling_id]
    else:
        # A limited one does not sleep (three_at_once sleeps 0.2 s unless
        # told): every example's rows are run in one batch by two threads.
        [job_id] = job_factory(
            1,
            shard=shard,
            task_path=LIMITED_PATH if state == "limited" else "tests.taskapp.tasks.noop",
            kwargs={"sleep": 0} if state == "limited" else None,
        )
    if state == "limited":
        sql("UPDATE shardq_job SET limit_keys = %s::jsonb WHERE id = %s", [LIMITED_KEYS, job_id])
    if state == "rescued":
        sql(
            "UPDATE shardq_job SET status = 'RUNNING', fence = 0, status_rank = 2, attempts = 1, "
            "worker_ids = '[\"gone\"]', started_at = clock_timestamp(), last_attempted_at = clock_timestamp() "
            "WHERE id = %s",
            [job_id],
        )
    if value is None:
        expression, params = "NULL", []
    elif data_type == "timestamp with time zone" and value.startswith("now"):
        expression, params = f"clock_timestamp() {value[3:]}", []
    else:
        expression, params = f"%s::{'timestamptz' if data_type.startswith('timestamp') else data_type}", [value]
    try:
        [(job_id,)] = sql(f"UPDATE shardq_job SET {name} = {expression} WHERE id = %s RETURNING id", [*params, job_id])
    except IntegrityError as exc:  # an id taken by another row
        sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [[job_id, *others]])
        raise Unstorable from exc
    except DataError as exc:  # a value the column's type refuses after all (PostgreSQL's own limits)
        sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [[job_id, *others]])
        if "stack depth" in str(exc) or "exceeds the maximum" in str(exc) or "out of range" in str(exc):
            raise Unstorable from exc
        raise
    return job_id, others


class Unstorable(Exception):
    """The drawn value cannot be written (the example is rejected)."""


@pytest.mark.timeout(1800 if FULL else 600)  # full: about 1,000 examples
def test_any_value_of_any_column_leaves_the_worker_up_and_every_other_job_done(fast_poll):
    """Every example's rows are in the table at once: Hypothesis draws and
    writes each column's values (the odd rows and their valid jobs) while
    the worker runs, checking after each write that no service has failed;
    then, once for them all, every valid job must be done, with an idle
    round of the fetcher and two renewals (each with its rescue) after every
    row was written. Waiting for those once, not once a value, is what keeps
    this test short (it waited 0.4 s an example, 31 s in all)."""
    table = columns()
    assert {"limit_keys", "run_after", "priority", "args", "worker_ids"} <= {c[0] for c in table}
    # Odd ids stay in the table while later rows take ids from the sequence:
    # start it past every small id an example draws.
    sql(
        "SELECT setval(pg_get_serial_sequence('shardq_job', 'id'), greatest(%s, last_value)) FROM shardq_job_id_seq",
        [10**6],
    )
    with in_process_worker(concurrency=2) as worker:
        written = Written()
        try:
            for name, data_type, nullable, length in table:
                write_column(worker, written, name, data_type, nullable, length)
                if len(written.values) >= BATCH_EXAMPLES:
                    check_batch(worker, written)
                    written = Written()
            check_batch(worker, written)
        finally:
            sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [[*written.odd, *written.good]])


# The examples whose rows are in the table at once (make test writes all of
# them; the full size checks and deletes them in batches).
BATCH_EXAMPLES = 300


class Written:
    """The rows an unchecked batch of examples wrote: the odd ones, the
    valid jobs beside them, and (column, value) of each example."""

    def __init__(self) -> None:
        self.odd: list[int] = []
        self.good: list[int] = []
        self.values: list[tuple[str, str | None]] = []

    def describe(self) -> str:
        return "; ".join(f"{name} = {value!r:.80}" for name, value in self.values)


def write_column(worker, written: Written, name: str, data_type: str, nullable: bool, length: int | None) -> None:
    """Hypothesis over the values of one column, with the worker running:
    each example's rows written, none waited for (check_batch does)."""

    @settings(max_examples=EXAMPLES_PER_COLUMN, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(value_of(data_type, nullable, length), st.integers(0, 63))
    def example(value, shard):
        # The value in a row of every state at once: each path reads it.
        odd: list[int] = []
        good: list[int] = []
        try:
            for i, state in enumerate(STATES):
                job_id, others = write_odd_job(name, data_type, distinct(name, value, i), state, shard)
                odd.append(job_id)
                good += others
        except Unstorable:
            sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [[*odd, *good]])
            reject()
        good += [int(r.id) for r in shardq.enqueue_many(t.noop, [((), {}) for _ in range(3)])]
        good += [int(r.id) for r in shardq.enqueue_many(limit_tasks.three_at_once, [((), {"sleep": 0})])]
        written.odd += odd
        written.good += good
        written.values.append((name, value))
        # A service that fails at once is named beside the value it read.
        assert not failed(worker), f"rows with {name} = {value!r:.200} stopped {failed(worker)}"

    example()


def check_batch(worker, written: Written) -> None:
    """Every valid job written beside the batch's odd rows done, then an idle
    round of the fetcher (it asks seconds_until_due) and two heartbeats
    since the last row was written (each renewal rescues the jobs of
    superseded fences), every service alive; the batch's rows deleted."""
    heartbeats = worker.stats["heartbeats"]
    try:
        wait_until(
            lambda: done(written.good) or failed(worker),
            timeout=60,
            message=lambda: f"the other jobs, beside rows with {written.describe():.3000}: {pending(written.good)}",
        )
        claims = worker.stats["claim_statements"]
        wait_until(
            lambda: (
                (worker.stats["claim_statements"] >= claims + 2 and worker.stats["heartbeats"] >= heartbeats + 2)
                or failed(worker)
            ),
            timeout=10,
        )
        assert not failed(worker), f"rows with {written.describe():.3000} stopped {failed(worker)}"
    finally:
        sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [[*written.odd, *written.good]])
        written.odd.clear()
        written.good.clear()


def distinct(name: str, value: str | None, i: int) -> str | None:
    """The value for the ``i``-th row of an example: ids must differ."""
    if name != "id" or value is None:
        return value
    number = int(value)
    return str(number - i if number >= 0 else number + i)


@pytest.fixture
def fast_poll(settings):
    """A fast poll and heartbeat: each example waits for an idle round of the
    fetcher and for two renewals of the leases (each with its rescue)."""
    settings.SHARDQ = {**settings.SHARDQ, "POLL_INTERVAL": 0.05, "HEARTBEAT": 0.2, "METRICS_PORT": None}
    yield


def done(ids) -> bool:
    return sql("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [[int(i) for i in ids]])[
        0
    ][0] == len(ids)


def pending(ids) -> list:
    return sql(
        "SELECT id, status, left(errors::text, 300) FROM shardq_job WHERE id = ANY(%s) AND status <> 'SUCCESSFUL'",
        [[int(i) for i in ids]],
    )


def failed(worker) -> dict[str, str]:
    return {service.name: repr(service.failure) for service in worker.services() if service.failure is not None}


# Dead-owner detection (migration 0025): a peer's recorded lease session, any
# value of each column's type, and the values that reach pg_stat_activity: a
# live session's pid (this test's own) and this server's start.
DEAD_OWNER_LIVE_START = "(SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
DEAD_OWNER_VALUES = {
    "backend_pid": st.one_of(st.none(), integers(*INT_RANGES["integer"]).map(str), st.just("pg_backend_pid()")),
    "backend_start": st.one_of(st.none(), timestamps(), st.just(DEAD_OWNER_LIVE_START)),
    "server_started": st.one_of(st.none(), timestamps(), st.just("pg_postmaster_start_time()")),
    "listener_pid": st.one_of(st.none(), integers(*INT_RANGES["integer"]).map(str), st.just("pg_backend_pid()")),
    "listener_start": st.one_of(st.none(), timestamps(), st.just(DEAD_OWNER_LIVE_START)),
}


def sql_value(value: str | None) -> tuple[str, list[str]]:
    """An SQL expression and its parameters for a drawn timestamptz/int value."""
    if value is None:
        return "NULL", []
    if value.startswith("now"):
        return f"clock_timestamp() {value[3:]}", []
    if value.startswith(("pg_", "(SELECT")):
        return value, []
    return "%s", [value]


@pytest.mark.timeout(1800 if FULL else 600)
def test_any_recorded_lease_session_of_a_peer_leaves_the_worker_up_and_its_shards_held(fast_poll):
    """Peers (STOPPING: read by the dead-owner check, not counted members
    of the pool) each hold one shard for a second, their recorded sessions
    any values of the five columns (lease and LISTEN sessions): the worker's
    check and heartbeat go on, no service fails, and the worker holds all 64
    shards again (a peer's taken as a dead owner's, or once its lease ends),
    and runs jobs. Hypothesis writes one peer an example, each on a shard
    of its own, and the worker's recovery is waited for once a batch of
    peers (up to PEERS_AT_ONCE), not once a peer: each waited out the
    one-second lease (16 s in all)."""
    columns = {
        name for (name,) in sql("SELECT column_name FROM information_schema.columns WHERE table_name = 'shardq_worker'")
    }
    assert set(DEAD_OWNER_VALUES) <= columns

    with in_process_worker(concurrency=2) as worker:
        peers = Peers()
        takeovers: list[int] = []

        @settings(
            max_examples=EXAMPLES_PER_COLUMN * 6, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            DEAD_OWNER_VALUES["backend_pid"],
            DEAD_OWNER_VALUES["backend_start"],
            DEAD_OWNER_VALUES["server_started"],
            st.tuples(DEAD_OWNER_VALUES["listener_pid"], DEAD_OWNER_VALUES["listener_start"]),
            st.integers(0, 63),
        )
        # Always: a session gone from this server (the shard taken as a dead
        # owner's) and a live one (kept until its lease ends).
        @hypothesis_example("2147483647", None, "pg_postmaster_start_time()", (None, None), 5)
        @hypothesis_example("2147483647", None, "pg_postmaster_start_time()", ("2147483646", None), 4)
        @hypothesis_example("pg_backend_pid()", DEAD_OWNER_LIVE_START, "pg_postmaster_start_time()", (None, None), 6)
        def example(pid, start, server, listener, shard):
            peer = str(uuid.uuid4())
            parts = [sql_value(v) for v in (pid, start, server, *listener)]
            try:
                sql(
                    "INSERT INTO shardq_worker (id, host, pid, queues, pool, started_at, heartbeat_at, state, stats, "
                    "name, backend_pid, backend_start, server_started, listener_pid, listener_start) VALUES "
                    "(%s, 'odd', 1, '[]', '*', clock_timestamp(), clock_timestamp(), 'STOPPING', '{}', '', "
                    f"({parts[0][0]})::int, ({parts[1][0]})::timestamptz, ({parts[2][0]})::timestamptz, "
                    f"({parts[3][0]})::int, ({parts[4][0]})::timestamptz)",
                    [peer, *(param for _, params in parts for param in params)],
                )
            except DataError as exc:  # a timestamp PostgreSQL's own range refuses
                if "out of range" in str(exc):
                    reject()
                raise
            if len(peers.ids) == PEERS_AT_ONCE:
                check_peers(worker, peers)
                takeovers.append(worker.stats["dead_owner_takeovers"])
            # A shard of its own (the drawn one, or the next no peer of the
            # batch holds): each peer's session is read while it holds one.
            shard = next(s % 64 for s in range(shard, shard + 64) if s % 64 not in peers.shards)
            peers.add(peer, (pid, start, server, listener), shard)
            leased_shard_factory([shard], worker=peer, lease_seconds=1.0)
            peers.good += [int(r.id) for r in shardq.enqueue_many(t.noop, [((), {})])]
            # A service that fails at once is named beside the session it read.
            assert not failed(worker), (
                f"a peer's session ({pid!r}, {start!r}, {server!r}, {listener!r}) stopped {failed(worker)}"
            )

        try:
            example()
            check_peers(worker, peers)
        finally:
            sql("DELETE FROM shardq_job WHERE task_path = 'tests.taskapp.tasks.noop'")
            sql("DELETE FROM shardq_worker WHERE id = ANY(%s)", [peers.ids])
        takeovers.append(worker.stats["dead_owner_takeovers"])
        # The session gone from this server was taken as a dead owner's.
        assert takeovers[-1] >= 1, takeovers


# Peers holding a shard at once (half the shards: the worker keeps the rest).
PEERS_AT_ONCE = 32


class Peers:
    """The peers of a batch not yet waited for: ids, sessions, shards and
    the job enqueued beside each."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.sessions: list[tuple] = []
        self.shards: set[int] = set()
        self.good: list[int] = []

    def clear(self) -> None:
        self.ids, self.sessions, self.shards, self.good = [], [], set(), []

    def add(self, peer: str, session: tuple, shard: int) -> None:
        self.ids.append(peer)
        self.sessions.append(session)
        self.shards.add(shard)


def check_peers(worker, peers: Peers) -> None:
    """After the batch's last peer took its shard: three dead-owner checks
    and two heartbeats, all 64 shards held again, every job done, no service
    failed; the batch's peers and jobs deleted."""
    checks, heartbeats = worker.stats["dead_owner_checks"], worker.stats["heartbeats"]
    try:
        wait_until(
            lambda: (
                (
                    worker.stats["dead_owner_checks"] >= checks + 3
                    and worker.stats["heartbeats"] >= heartbeats + 2
                    and len(worker.leaser.held) == 64
                    and done(peers.good)
                )
                or failed(worker)
            ),
            timeout=30,
            message=lambda: f"the worker beside peers' sessions {peers.sessions}",
        )
        assert not failed(worker), f"peers' sessions {peers.sessions} stopped {failed(worker)}"
    finally:
        sql("DELETE FROM shardq_job WHERE id = ANY(%s)", [peers.good])
        sql("DELETE FROM shardq_worker WHERE id = ANY(%s)", [peers.ids])
        peers.clear()
