"""Value types passed between the worker's services."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# The start verdict of a job whose start write committed (starter.py).
STARTED = "started"


@dataclass(slots=True)
class ClaimedJob:
    """A job this worker claimed: CLAIMED in the table under ``fence`` until an
    executor starts it (``start_jobs`` makes it RUNNING, counts the attempt and
    updates ``attempts``, ``status_rank``, ``started_at`` and
    ``last_attempted_at`` here).

    Built only from a claim's row, whose values passed the claim's
    ``job_problem`` (shardq/db/queries.sql), the one boundary where rows
    become jobs: a row that fails it comes back with ``problem`` set (and no
    value this worker cannot hold: its times and limit_keys are None) and is
    never run. So every field here is of its type and range: ranks,
    attempts and losses in 0..2147483000, ``max_attempts`` >= 1, the
    priority in -100..100, the times Python datetimes, the JSON texts of
    the kind their names say and decodable by ``json`` (at most 200 deep,
    no integer of more than 4300 digits), ``limit_keys`` None or distinct
    strings."""

    id: int
    task_path: str
    queue_name: str
    priority: int
    run_after: float
    shard: int
    shard_key: str | None
    ordered: bool
    args_json: str  # decoded by ``args``/``kwargs`` (no arguments: no JSON parse)
    kwargs_json: str
    attempts: int
    max_attempts: int
    fence: int
    status_rank: int
    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    worker_ids_json: str  # decoded only when a TaskResult is built
    errors_json: str
    error_count: int
    backend: str
    payload_bytes: int = 0
    worker_losses: int = 0
    # Set on a row the claim quarantined (what was unreadable): never run.
    problem: str | None = None
    # Started by the claim itself (RUNNING, attempt counted): no start write.
    # ``previous_attempt_at`` lets a hand-back take that start back.
    started: bool = False
    previous_attempt_at: datetime | None = None
    # The limits it counts against (sorted keys, docs/limits.md), None: none.
    limit_keys: list[str] | None = None
    # Limited by its own shard key (docs/limits.md): the local queue runs at
    # most the task's max_concurrency of the key at once.
    key_limited: bool = False
    # The W3C traceparent of the span that enqueued it (shardq/tracing.py).
    traceparent: str | None = None
    # Its fair key and own weight (docs/fairness.md; None: none, weight from settings).
    fair_key: str | None = None
    fair_weight: int | None = None
    # -- not columns: set in this worker --
    # How long its task ran here (the executor's measure; None: not run):
    # charged to its fair key when its share counts time (docs/fairness.md).
    ran_seconds: float | None = None
    # Set by the start write: this worker id was appended to worker_ids.
    started_by: str | None = None
    # The verdict of this job's start write (starter.py; None: not written:
    # the executor fails it without running, or has not begun it).
    start_verdict: tuple | None = None
    # The log of its attempt running here (worker/joblogs.py; None: not
    # kept): read at the deadline for the outcome written then.
    attempt_log: Any = None
    # Ran here under an earlier claim whose outcome was refused: the return
    # value's JSON to write under this claim instead of running it again
    # (Fetcher.take, Executor.execute).
    recalled: str | None = None

    @classmethod
    def from_row(cls, row: dict) -> "ClaimedJob":
        """From a ``claim_jobs`` row, by name."""
        return cls(**row)

    @property
    def key(self) -> str | None:
        return self.shard_key

    @property
    def args(self) -> list[Any]:
        return [] if self.args_json == "[]" else json.loads(self.args_json)

    @property
    def kwargs(self) -> dict[str, Any]:
        return {} if self.kwargs_json == "{}" else json.loads(self.kwargs_json)

    @property
    def is_started(self) -> bool:
        """Is its start recorded (by its thread's start write)?"""
        return self.started or self.started_by is not None

    @property
    def worker_ids(self) -> list:
        ids = json.loads(self.worker_ids_json)
        ids = [str(i) for i in ids] if isinstance(ids, list) else []
        return [*ids, self.started_by] if self.started_by else ids

    @property
    def errors(self) -> list:
        """The recorded errors; entries that are not Django TaskError fields
        (a row written by hand) are kept as text, never raised on."""
        raw = json.loads(self.errors_json)
        errors = []
        for entry in raw if isinstance(raw, list) else []:
            if (
                isinstance(entry, dict)
                and set(entry) == {"exception_class_path", "traceback"}
                and all(isinstance(v, str) for v in entry.values())
            ):
                errors.append(entry)
            else:
                errors.append(
                    {
                        "exception_class_path": "shardq.exceptions.UnreadableJob",
                        "traceback": f"an unreadable error entry: {json.dumps(entry)[:200]}",
                    }
                )
        return errors


@dataclass(slots=True)
class Outcome:
    """What one attempt produced, written by the completer in one fenced batch.

    ``status`` is SUCCESSFUL, FAILED, or READY (retry after ``delay`` seconds).
    ``rank`` is the claim's status_rank + 1: the write applies only if nothing
    moved the job since this worker claimed it.
    """

    id: int
    fence: int
    rank: int
    status: str
    return_value_json: str | None = None
    error_json: str | None = None
    delay: float = 0.0
    shard: int = -1
    attempts: int = 0
    extra: dict = field(default_factory=dict)
    # The attempt's entry of the job's per-job logs (JSON; None: nothing
    # logged), and the job's bound, SHARDQ["JOB_LOG_BYTES"] (worker/joblogs.py).
    log_json: str | None = None
    log_bytes: int = 0
    # The job it ends, for the metrics' labels (set only when metrics are on).
    job: ClaimedJob | None = None
    # Called once the completer is done with it (written, refused or given
    # up): what the job held until its outcome is in the table (its limit
    # slot, its key's gate) is let go then (Executor._left).
    after_written: Callable[[], None] | None = None

    @staticmethod
    def error(exception_class_path: str, traceback: str) -> str:
        return json.dumps({"exception_class_path": exception_class_path, "traceback": traceback})
