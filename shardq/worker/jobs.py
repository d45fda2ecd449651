"""Value types passed between the worker's services."""

import json
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(slots=True)
class ClaimedJob:
    """A job this worker claimed (RUNNING in the table under ``fence``)."""

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

    @classmethod
    def from_row(cls, row) -> "ClaimedJob":
        return cls(*row)

    @property
    def key(self) -> str | None:
        return self.shard_key

    @property
    def args(self):
        return [] if self.args_json == "[]" else json.loads(self.args_json)

    @property
    def kwargs(self):
        return {} if self.kwargs_json == "{}" else json.loads(self.kwargs_json)

    @property
    def worker_ids(self) -> list:
        return json.loads(self.worker_ids_json)

    @property
    def errors(self) -> list:
        return json.loads(self.errors_json)


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

    @staticmethod
    def error(exception_class_path: str, traceback: str) -> str:
        return json.dumps({"exception_class_path": exception_class_path, "traceback": traceback})
