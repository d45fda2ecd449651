"""Durable long jobs: steps, cursors and suspended waits (docs/durable.md).

A task declared with ``takes_context=True`` gets, through its context::

    plan = context.step("plan", make_plan, tenant_id)        # recorded once, replayed after
    for batch in context.iterate(Order.objects.filter(...), by="pk", size=500):
        ...                                                  # commits with the cursor
    context.sleep(timedelta(hours=1))                        # suspends: the thread is freed
    reply = context.wait_for("approved", timeout=timedelta(days=2))

State model of a durable job (the job row's status; every change fenced)::

    RUNNING ──step / batch recorded──▶ RUNNING (the record survives any end of the attempt)
    RUNNING ──boundary while stopping or handed over──▶ READY (attempt taken back; resumes)
    RUNNING ──boundary after a cancel──▶ FAILED (Cancelled, written by the cancel itself)
    RUNNING ──sleep / wait_for──▶ SUSPENDED (attempt taken back) ──time or signal──▶ READY

The replay rule: after a resume, a retry or a crash the function runs again
from the top. ``step`` returns what it recorded without calling its
function, ``iterate`` starts after the last committed batch (a finished one
yields nothing), a sleep that has passed returns at once and a wait that got
its signal returns the recorded payload. Code between these calls runs again
each time, as in Temporal and Inngest: keep it free of side effects, or put
them in a step.

The exactly-once rule: a batch of ``iterate`` over a queryset runs in
``transaction.atomic()`` on the queryset's database (which must be shardq's),
and the cursor is written last in that transaction, fenced by the attempt.
If the attempt lost the job (a takeover, a zombie's late batch) the cursor
write matches no row, ``FenceLost`` is raised and the batch's writes roll
back with it. So each batch's database writes commit exactly once. What is
not inside the transaction (an email, an HTTP call, a write on another
database) is at least once, per batch: a crash after it and before the
commit runs that batch again.

Sync tasks only, as ``shardq.complete_in_transaction``: the writes go over
the task thread's Django connection.
"""

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import QuerySet
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone

from .db import operations
from .exceptions import DuplicateStep, FenceLost, Interrupted, SignalRefused, SignalTimeout, Suspended

#: Names of the calls shardq names itself (iterations, sleeps, waits) start with this.
RESERVED_PREFIX = "$"

FINISHED = ("SUCCESSFUL", "FAILED")


@dataclass(slots=True)
class Record:
    """One row of shardq_job_step as this run knows it."""

    kind: str
    output: Any = None
    batches: int = 0
    total: int | None = None
    done: bool = False
    until: datetime | None = None
    due: bool = False


def _json(value: object, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), cls=DjangoJSONEncoder)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} is not JSON ({exc}): a durable record holds str, int, float, bool, None, list or dict"
        ) from exc


def _decoded(value: Any) -> Any:
    # psycopg hands jsonb back decoded; a row read as text would not be.
    return json.loads(value) if isinstance(value, str) else value


class DurableRun:
    """The durable calls of one attempt (``context.step`` and the others).

    Built by the executor with the attempt's fencing (job id, fence, rank,
    shard), the database of shardq's tables and ``boundary``: a function
    that returns why the attempt must stop at its next boundary
    (``"shutdown"``, ``"handover"``, ``"cancel"``) or None."""

    def __init__(
        self,
        *,
        job_id: int,
        fence: int,
        rank: int,
        shard: int,
        using: str = DEFAULT_DB_ALIAS,
        idle_ms: int = 30_000,
        boundary: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.job_id = job_id
        self.fence = fence
        self.rank = rank
        self.shard = shard
        self.using = using
        self.idle_ms = idle_ms
        self.boundary = boundary
        self._records: dict[str, Record] | None = None
        self._names: set[str] = set()
        self._counters: dict[str, itertools.count[int]] = {}
        self._open: list[Iterator[Any]] = []
        # What this run did, for the worker's counters.
        self.batches_run = 0

    # -- the records ---------------------------------------------------------------

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {
            "id": self.job_id,
            "fence": self.fence,
            "rank": self.rank,
            "shard": self.shard,
            "idle_ms": self.idle_ms,
            **extra,
        }

    def records(self) -> dict[str, Record]:
        """What the job recorded before this run (read once a run)."""
        if self._records is None:
            rows = operations.run("load_steps", {"id": self.job_id}, using=self.using, named=True)
            self._records = {
                row["name"]: Record(
                    kind=row["kind"],
                    output=_decoded(row["output"]),
                    batches=row["batches"],
                    total=row["total"],
                    done=row["done"],
                    until=row["until"],
                    due=row["due"],
                )
                for row in rows
            }
        return self._records

    def _take_name(self, name: str, kind: str) -> Record | None:
        if name in self._names:
            raise DuplicateStep(
                f"job {self.job_id}: the name {name!r} is used twice in one run; each step "
                "records one result under its name: give each call its own name"
            )
        self._names.add(name)
        record = self.records().get(name)
        if record is not None and record.kind != kind:
            raise DuplicateStep(
                f"job {self.job_id}: {name!r} was recorded by a {record.kind}, not a {kind}: "
                "the task's code changed under a running job, or two calls share a name"
            )
        return record

    def _auto_name(self, kind: str, label: str = "") -> str:
        counter = self._counters.setdefault(kind + label, itertools.count(1))
        return f"{RESERVED_PREFIX}{kind}{':' + label if label else ''}#{next(counter)}"

    def _lost(self, what: str) -> FenceLost:
        return FenceLost(
            f"job {self.job_id}: the fence {self.fence} of this attempt is no longer current "
            f"(shard {self.shard} changed hands or the job moved on); {what} is not recorded"
        )

    def _record(
        self,
        name: str,
        kind: str,
        output: Any,
        *,
        done: bool = True,
        until: datetime | None = None,
        seconds: float | None = None,
    ) -> Record:
        text = _json(output, f"the output of {kind} {name!r}")
        row = operations.run(
            "record_step",
            self._params(name=name, kind=kind, output=text, done=done, until=until, seconds=seconds),
            using=self.using,
            fetch="one",
        )
        if row is None:
            raise self._lost(f"{kind} {name!r}")
        record = Record(kind=kind, output=json.loads(text), done=done, until=row[0], due=row[1])
        self.records()[name] = record
        return record

    def check_boundary(self) -> None:
        """Stop here (``Interrupted``) if the worker stops, the shard is
        handed over or the job was cancelled; otherwise return at once."""
        reason = self.boundary()
        if reason is not None:
            raise Interrupted(reason)

    # -- steps -----------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not isinstance(name, str) or not name or name.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"a step name is a non-empty str not starting with {RESERVED_PREFIX!r} (shardq's own), not {name!r}"
            )
        record = self._take_name(name, "step")
        if record is not None:
            return record.output
        # Between steps: a boundary.
        self.check_boundary()
        value = fn(*args, **kwargs)
        return self._record(name, "step", value).output

    # -- iterations ----------------------------------------------------------------------

    def iterate(
        self,
        source: Any,
        by: str = "pk",
        size: int = 100,
        *,
        cursor: Any = None,
        name: str | None = None,
        count: bool = True,
        total: int | None = None,
    ) -> Iterator[list[Any]]:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"iterate: size must be an int of at least 1, not {size!r}")
        if name is None:
            name = self._auto_name("iterate")
        elif not isinstance(name, str) or not name or name.startswith(RESERVED_PREFIX):
            raise ValueError(f"iterate: name must be a non-empty str not starting with {RESERVED_PREFIX!r}")
        if isinstance(source, QuerySet):
            fetch = self._keyset(source, by, size)
            using = source.db
            if using != self.using:
                raise ValueError(
                    f"iterate: the queryset reads database {using!r}, but shardq's tables (where the "
                    f"cursor is committed with each batch) are on {self.using!r}: one transaction cannot "
                    "span both. Iterate a queryset of shardq's database, or use the generic form "
                    "iterate(fn) (at least once per batch)."
                )
            if count and total is None:
                counter: Callable[[], int | None] = source.count
            else:
                counter = lambda: total  # noqa: E731
        elif callable(source):
            fetch = source
            counter = lambda: total  # noqa: E731
        else:
            raise TypeError(
                "iterate takes a QuerySet (walked by keyset on `by`) or a function fn(cursor) -> "
                f"(items, next_cursor); got {type(source).__name__}"
            )
        if self._in_transaction():
            raise RuntimeError(
                "iterate runs each batch in a transaction of its own (its writes commit with the "
                "cursor): call it outside transaction.atomic()"
            )
        record = self._take_name(name, "iterate")
        walk = self._walk(name, record, fetch, cursor, counter)
        self._open.append(walk)
        return walk

    @staticmethod
    def _keyset(queryset: QuerySet, by: str, size: int) -> Callable[[Any], tuple[list[Any], Any]]:
        descending = by.startswith("-")
        field = by.lstrip("-")
        ordered = queryset.order_by(by)

        def fetch(cursor: Any) -> tuple[list[Any], Any]:
            page = ordered
            if cursor is not None:
                page = page.filter(**{f"{field}__{'lt' if descending else 'gt'}": cursor})
            items = list(page[:size])
            if not items:
                return [], None
            last = items[-1]
            position = last[field] if isinstance(last, dict) else getattr(last, field)
            # Short page: the walk has reached the end (no extra query).
            return items, (position if len(items) == size else None)

        return fetch

    def _walk(
        self,
        name: str,
        record: Record | None,
        fetch: Callable[[Any], tuple[list[Any], Any]],
        start: Any,
        counter: Callable[[], int | None],
    ) -> Iterator[list[Any]]:
        if record is not None and record.done:
            return
        if record is None:
            # First start: the position and the total, recorded before any batch.
            self._save(name, start, batches=0, total=counter(), done=False)
            position = start
        else:
            position = _decoded(record.output).get("cursor") if isinstance(record.output, dict) else None
        while True:
            # Between batches: a boundary.
            self.check_boundary()
            # Each batch, its writes and its cursor in one transaction: a
            # fence that fails rolls the batch back (FenceLost); so does an
            # exception of the task's in it (the executor closes this walk).
            with transaction.atomic(using=self.using):
                items, following = fetch(position)
                if not items and following is None:
                    self._save(name, position, batches=0, total=None, done=True)
                    return
                yield items
                self._save(name, following, batches=1, total=None, done=following is None)
            self.batches_run += 1
            if following is None:
                return
            position = following

    def _save(self, name: str, position: Any, *, batches: int, total: int | None, done: bool) -> None:
        text = _json({"cursor": position}, f"the cursor of iteration {name!r}")
        row = operations.run(
            "save_cursor",
            self._params(name=name, output=text, batches=batches, total=total, done=done),
            using=self.using,
            fetch="one",
        )
        if row is None:
            raise self._lost(f"the batch of iteration {name!r}")

    def close(self) -> None:
        """End the walks left open (the task raised or returned inside one):
        a batch not finished rolls back."""
        while self._open:
            self._open.pop().close()  # type: ignore[attr-defined]

    # -- suspension ----------------------------------------------------------------------

    def sleep(self, delay: timedelta | float) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"sleep takes a timedelta or seconds, not {type(delay).__name__}")
        self._sleep(self._auto_name("sleep"), seconds=float(seconds))

    def sleep_until(self, when: datetime) -> None:
        if not isinstance(when, datetime):
            raise TypeError(f"sleep_until takes a datetime, not {type(when).__name__}")
        if timezone.is_naive(when):
            raise ValueError("sleep_until takes an aware datetime (django.utils.timezone.now() + ...)")
        self._sleep(self._auto_name("sleep"), until=when)

    def _in_transaction(self) -> bool:
        """Is the task inside a transaction of its own (or a batch)?"""
        return connections[self.using].in_atomic_block

    def _outside_transactions(self, call: str) -> None:
        # A suspension ends the attempt: a transaction around it (a batch of
        # iterate, the task's own atomic) would roll its record back.
        if self._in_transaction():
            raise RuntimeError(
                f"{call} suspends the job: call it outside transaction.atomic() and outside iterate's batches"
            )

    def _sleep(self, name: str, *, seconds: float | None = None, until: datetime | None = None) -> None:
        self._outside_transactions("sleep")
        record = self._take_name(name, "sleep")
        if record is None:
            record = self._record(name, "sleep", None, until=until, seconds=seconds)
        if not record.due:
            raise Suspended(record.until)

    def wait_for(self, signal: str, timeout: timedelta | float | None = None) -> Any:
        if not isinstance(signal, str) or not signal:
            raise ValueError(f"wait_for: the signal name is a non-empty str, not {signal!r}")
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
            raise TypeError(f"wait_for: timeout is a timedelta, seconds or None, not {type(timeout).__name__}")
        self._outside_transactions("wait_for")
        name = self._auto_name("wait", signal)
        record = self._take_name(name, "wait")
        if record is not None and record.done:
            return self._waited(signal, record)
        row = operations.run(
            "consume_signal", self._params(name=name, signal=signal), using=self.using, fetch="one", named=True
        )
        if not row["held"]:
            raise self._lost(f"the wait for {signal!r}")
        if row["taken"]:
            payload = _decoded(row["payload"])
            self.records()[name] = Record(kind="wait", output={"signal": signal, "payload": payload}, done=True)
            return payload
        if record is None:
            record = self._record(
                name, "wait", {"signal": signal}, done=False, seconds=None if seconds is None else float(seconds)
            )
        if record.until is not None and record.due:
            record = self._record(name, "wait", {"signal": signal, "timed_out": True})
            return self._waited(signal, record)
        raise Suspended(record.until, wait_name=signal)

    def _waited(self, signal: str, record: Record) -> Any:
        output = record.output if isinstance(record.output, dict) else {}
        if output.get("timed_out"):
            raise SignalTimeout(f"job {self.job_id}: no signal {signal!r} arrived before the wait's timeout")
        return output.get("payload")


def signal(job: Any, name: str, payload: Any = None, *, using: str | None = None) -> bool:
    """Send signal ``name`` with ``payload`` (JSON) to a durable job.

    ``job`` is a ``TaskResult`` or its id. Runs on the caller's connection,
    inside its transaction if any: the signal exists iff the caller commits.
    A job suspended in ``wait_for(name)`` wakes (READY, NOTIFYed at commit);
    otherwise the signal is kept until a ``wait_for(name)`` of the job
    consumes it. Returns whether a waiting job was woken. Raises
    ``TaskResultDoesNotExist`` for an unknown job and ``SignalRefused`` for
    one that has finished."""
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, TaskResult, task_backends

    from .conf import get_config
    from .enqueue.results import parse_job_id

    alias = job.backend if isinstance(job, TaskResult) else DEFAULT_TASK_BACKEND_ALIAS
    raw_id = job.id if isinstance(job, TaskResult) else job
    job_id = parse_job_id(raw_id)
    if job_id is None:
        raise TaskResultDoesNotExist(
            f"{raw_id!r} is not a shardq job id (the decimal id of a TaskResult, e.g. result.id)."
        )
    if not isinstance(name, str) or not name:
        raise ValueError(f"signal: the name is a non-empty str, not {name!r}")
    payload_json = _json(payload, f"the payload of signal {name!r}")
    database = using or getattr(task_backends[alias], "database_alias", DEFAULT_DB_ALIAS)
    config = get_config()
    with transaction.atomic(using=database):
        row = operations.run("lock_signalled_job", {"id": job_id}, using=database, fetch="one")
        if row is None:
            raise TaskResultDoesNotExist(f"signal {name!r}: there is no job {job_id}")
        if row[0] in FINISHED:
            raise SignalRefused(
                f"signal {name!r}: job {job_id} has finished ({row[0]}); no wait of it can receive a signal"
            )
        sent = operations.run(
            "send_signal",
            {"id": job_id, "name": name, "payload": payload_json, "channel": config.channel, "notify": config.notify},
            using=database,
            fetch="one",
        )
    return bool(sent[1])
