"""``drain()``'s durable calls (docs/durable.md, docs/testing.md).

A drained job runs inside the test's transaction, where no worker holds a
lease and nothing commits, so its records cannot be fenced rows of
``shardq_job_step``. ``DrainedRun`` is the worker's ``DurableRun`` with the
records kept in memory, per job, for the drain: ``step`` calls its function
once and returns the recorded JSON output on the job's later attempts (the
retries the drain follows); ``iterate`` walks in the same batches, each in
a savepoint with its cursor, and a later attempt resumes after the last
batch. A run whose transaction failed (its savepoint rolled back) keeps
none of its records, as its writes are gone too. ``sleep``, ``sleep_until``
and ``wait_for`` suspend a job, which a drain cannot (nothing wakes it
inside one test's transaction): they raise ``DrainCannotSuspend``; test
them with a worker (tests/helpers.py ``in_process_worker``).
"""

import json
from datetime import datetime
from typing import Any

from django.db import connections

from ..durable import DurableRun, Record, _json
from ..exceptions import ShardqError


class DrainCannotSuspend(ShardqError, RuntimeError):
    """A drained task called sleep, sleep_until or wait_for."""


class DrainedRun(DurableRun):
    """One drained run of a durable job; ``kept`` is the job's records so far
    (a copy: the drain keeps it if the run's savepoint was not rolled back)."""

    def __init__(self, *, job_id: int, using: str, kept: dict[str, Record]) -> None:
        super().__init__(job_id=job_id, fence=0, rank=0, shard=0, using=using)
        self._records = kept
        # The drain's savepoint (and the test's transaction) are the level the
        # task starts at: only a transaction of the task's own counts.
        self._depth = len(connections[using].atomic_blocks)

    def records(self) -> dict[str, Record]:
        assert self._records is not None
        return self._records

    def _in_transaction(self) -> bool:
        return len(connections[self.using].atomic_blocks) > self._depth

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
        record = Record(kind=kind, output=json.loads(text), done=done)
        self.records()[name] = record
        return record

    def _save(self, name: str, position: Any, *, batches: int, total: int | None, done: bool) -> None:
        text = _json({"cursor": position}, f"the cursor of iteration {name!r}")
        before = self.records().get(name)
        self.records()[name] = Record(
            kind="iterate",
            output=json.loads(text),
            batches=(before.batches if before else 0) + batches,
            total=total if total is not None else (before.total if before else None),
            done=done,
        )

    def _sleep(self, name: str, *, seconds: float | None = None, until: datetime | None = None) -> None:
        raise self._cannot("sleep")

    def wait_for(self, signal: str, timeout: Any = None) -> Any:
        raise self._cannot(f"wait_for({signal!r})")

    def _cannot(self, call: str) -> DrainCannotSuspend:
        return DrainCannotSuspend(
            f"job {self.job_id}: {call} suspends the job, which drain() cannot do (nothing wakes it inside "
            "the test's transaction); drain() runs step and iterate only: test suspensions with a worker"
        )
