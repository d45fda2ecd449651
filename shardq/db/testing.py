"""The store of ``shardq.testing``: the statements of ``testing.sql`` (and
the workers' ``resolve_children``) on a Django connection, inside the
caller's transaction, which in a test is the test's own.

Takes and returns plain values; the policy (what to run, what an outcome
is) is ``shardq/testing/``'s.
"""

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connections

from . import operations
from .queries import load

TESTING_QUERIES = load(Path(__file__).with_name("testing.sql"))

# Parents per resolve_children pass (as the worker's resolver).
RESOLVE_BATCH = 256


def _run(name: str, params: dict[str, Any], using: str) -> list[dict[str, Any]]:
    with connections[using].cursor() as cursor:
        cursor.execute(TESTING_QUERIES[name], params)
        if cursor.description is None:
            return []
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _filters(queues: Sequence[str] | None, task_paths: Sequence[str] | None, until: datetime | None) -> dict[str, Any]:
    return {
        "queues": None if queues is None else list(queues),
        "task_paths": None if task_paths is None else list(task_paths),
        "until": until,
    }


def start_next_job(
    using: str,
    *,
    worker: str,
    queues: Sequence[str] | None = None,
    task_paths: Sequence[str] | None = None,
    until: datetime | None = None,
) -> dict[str, Any] | None:
    """Start the next job to run (RUNNING, the attempt counted), by name;
    None when no READY job is left."""
    rows = _run("drain_start_job", {**_filters(queues, task_paths, until), "worker": worker}, using)
    return rows[0] if rows else None


def has_candidate(
    using: str,
    *,
    queues: Sequence[str] | None = None,
    task_paths: Sequence[str] | None = None,
    until: datetime | None = None,
) -> bool:
    """Is a READY job left that ``start_next_job`` would start?"""
    return bool(_run("drain_has_candidate", _filters(queues, task_paths, until), using)[0]["exists"])


def finish_job(
    using: str,
    job_id: int,
    *,
    rank: int,
    status: str,
    return_value_json: str | None = None,
    error_json: str | None = None,
    delay_seconds: float = 0.0,
) -> bool | None:
    """Write an attempt's outcome at ``rank``; whether the job has children
    waiting for it, or None when the job had moved on (nothing written)."""
    rows = _run(
        "drain_finish_job",
        {
            "id": job_id,
            "rank": rank,
            "status": status,
            "return_value": return_value_json,
            "error": error_json,
            "delay": delay_seconds,
        },
        using,
    )
    return bool(rows[0]["children_pending"]) if rows else None


def resolve_parents(using: str) -> int:
    """Move on the children of every finished workflow parent, as the
    workers' resolvers do (``resolve_children``, no NOTIFY); the number of
    children moved (made READY, or FAILED with ParentFailed)."""
    moved = 0
    while True:
        shards = [row["shard"] for row in _run("drain_parent_shards", {}, using)]
        if not shards:
            return moved
        rows = operations.run(
            "resolve_children",
            {"shards": shards, "batch": RESOLVE_BATCH, "channel": "shardq", "notify": False},
            using=using,
            named=True,
        )
        moved += sum(1 for row in rows if row["id"] is not None)
        # A pass that resolved no parent would resolve none the next time either.
        if not rows or not rows[0]["parents"]:
            return moved


def jobs(using: str, *, statuses: Sequence[str], task_paths: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Jobs in ``statuses`` (of ``task_paths``; None: any), oldest first, by name."""
    paths = None if task_paths is None else list(task_paths)
    return _run("testing_jobs", {"statuses": list(statuses), "task_paths": paths}, using)
