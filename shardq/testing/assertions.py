"""``enqueued()``, ``assert_enqueued()`` and ``assert_not_enqueued()``: what a
test enqueued and has not run yet (READY or WAITING jobs), read on the
test's connection, so inside its transaction.

Arguments are compared as JSON, the way they are stored: a tuple equals the
list it became, ``args`` and ``kwargs`` must equal the stored ones exactly
(None: any). A failed assertion says how each enqueued job of the task
differs from what was expected.
"""

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, Task, TaskResult, task_backends

from ..db import testing as testing_store
from .draining import _json, _shardq_backend, task_paths

#: The statuses of a job enqueued and not run yet (WAITING: a workflow job
#: whose parents have not finished; Django's API shows it READY).
NOT_RUN = ("READY", "WAITING")
RUN = ("CLAIMED", "RUNNING", "SUCCESSFUL", "FAILED")


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """A job enqueued and not run yet (its attempts count earlier runs of a
    job READY again for a retry)."""

    id: str
    task_path: str
    queue_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    run_after: datetime | None
    status: str
    attempts: int
    max_attempts: int
    shard_key: str | None
    enqueued_at: datetime
    backend: str

    @property
    def result(self) -> TaskResult:
        """The job's ``TaskResult``, read from the table now."""
        return task_backends[self.backend].get_result(self.id)

    def describe(self) -> str:
        return (
            f"job {self.id} {self.task_path} queue={self.queue_name!r} args={_text(self.args)} "
            f"kwargs={_text(self.kwargs)} ({self.status})"
        )


def _jobs(task: Task | str | Iterable[Task | str] | None, statuses: Sequence[str], backend: str) -> list[EnqueuedJob]:
    using = _shardq_backend(backend).database_alias
    rows = testing_store.jobs(using, statuses=statuses, task_paths=task_paths(task))
    return [
        EnqueuedJob(
            id=str(row["id"]),
            task_path=row["task_path"],
            queue_name=row["queue_name"],
            args=_json(row["args"]),
            kwargs=_json(row["kwargs"]),
            priority=row["priority"],
            run_after=row["run_after"],
            status=row["status"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            shard_key=row["shard_key"],
            enqueued_at=row["enqueued_at"],
            backend=row["backend"],
        )
        for row in rows
    ]


def enqueued(
    task: Task | str | Iterable[Task | str] | None = None,
    *,
    queue: str | None = None,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
) -> list[EnqueuedJob]:
    """The jobs enqueued and not run yet (READY or WAITING), oldest first: of
    ``task`` (a task, its module path, or a list; None: every task) and
    ``queue`` (None: every queue)."""
    return [job for job in _jobs(task, NOT_RUN, backend) if queue is None or job.queue_name == queue]


def _as_json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON, as enqueued arguments are: {exc}") from exc


def _expected(args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> tuple[list | None, dict | None]:
    if args is not None and (isinstance(args, (str, bytes, dict)) or not isinstance(args, Sequence)):
        raise TypeError(f"args must be a list or tuple of the positional arguments, not {args!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict of the keyword arguments, not {kwargs!r}")
    return (
        None if args is None else _as_json(list(args), "args"),
        None if kwargs is None else _as_json(kwargs, "kwargs"),
    )


def _text(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:199] + "…"


def _differences(job: EnqueuedJob, args: list | None, kwargs: dict | None, queue: str | None) -> list[str]:
    """How ``job`` differs from what was expected, one phrase a difference."""
    found = []
    if queue is not None and job.queue_name != queue:
        found.append(f"queue is {job.queue_name!r}, expected {queue!r}")
    if args is not None and job.args != args:
        if len(job.args) != len(args):
            found.append(f"args are {_text(job.args)} ({len(job.args)}), expected {_text(args)} ({len(args)})")
        else:
            found += [
                f"args[{i}] is {_text(got)}, expected {_text(want)}"
                for i, (got, want) in enumerate(zip(job.args, args, strict=True))
                if got != want
            ]
    if kwargs is not None and job.kwargs != kwargs:
        for name in sorted(kwargs.keys() | job.kwargs.keys()):
            if name not in job.kwargs:
                found.append(f"kwargs[{name!r}] is missing, expected {_text(kwargs[name])}")
            elif name not in kwargs:
                found.append(f"kwargs[{name!r}] is {_text(job.kwargs[name])}, not expected")
            elif job.kwargs[name] != kwargs[name]:
                found.append(f"kwargs[{name!r}] is {_text(job.kwargs[name])}, expected {_text(kwargs[name])}")
    return found


def _wanted(path: str, args: list | None, kwargs: dict | None, queue: str | None) -> str:
    parts = [path]
    if args is not None:
        parts.append(f"args={_text(args)}")
    if kwargs is not None:
        parts.append(f"kwargs={_text(kwargs)}")
    if queue is not None:
        parts.append(f"queue={queue!r}")
    return " ".join(parts)


def _single_path(task: Task | str) -> str:
    paths = task_paths(task)
    if paths is None or len(paths) != 1:
        raise ValueError(f"name one task (a task or its module path), not {task!r}")
    return paths[0]


def assert_enqueued(
    task: Task | str,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    *,
    count: int | None = None,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
) -> list[EnqueuedJob]:
    """Assert that a job of ``task`` is enqueued and not run yet (READY or
    WAITING) with exactly these ``args`` and ``kwargs`` (None: any) in
    ``queue`` (None: any); ``count``: exactly that many such jobs. Returns
    the matching jobs, oldest first. The AssertionError says how each
    enqueued job of the task differs."""
    path = _single_path(task)
    want_args, want_kwargs = _expected(args, kwargs)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be an int >= 0, not {count!r}")
    waiting = _jobs(None, NOT_RUN, backend)
    of_task = [job for job in waiting if job.task_path == path]
    matches = [job for job in of_task if not _differences(job, want_args, want_kwargs, queue)]
    if (matches and count is None) or (count is not None and len(matches) == count):
        return matches
    wanted = _wanted(path, want_args, want_kwargs, queue)
    if matches:
        lines = [f"expected {count} enqueued jobs of {wanted}, found {len(matches)}:"]
        lines += [f"  {job.describe()}" for job in matches]
        raise AssertionError("\n".join(lines))
    lines = [f"expected an enqueued job (READY or WAITING) of {wanted}, found none."]
    if of_task:
        lines.append(f"Enqueued jobs of {path} ({len(of_task)}), and how each differs:")
        for job in of_task:
            lines.append(f"  {job.describe()}")
            lines += [f"      {difference}" for difference in _differences(job, want_args, want_kwargs, queue)]
    else:
        lines.append(f"No job of {path} is enqueued.")
    others = Counter(job.task_path for job in waiting if job.task_path != path)
    if others:
        lines.append("Enqueued jobs of other tasks: " + ", ".join(f"{p} ×{n}" for p, n in sorted(others.items())))
    elif not of_task:
        lines.append("Nothing is enqueued at all.")
    ran = _jobs(path, RUN, backend)
    if ran:
        lines.append(
            f"{len(ran)} job(s) of {path} have run or are running already (enqueued() lists only those not run "
            "yet; drain() runs them): " + ", ".join(f"job {job.id} {job.status}" for job in ran[:10])
        )
    raise AssertionError("\n".join(lines))


def assert_not_enqueued(
    task: Task | str,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
) -> None:
    """Assert that no job of ``task`` with these ``args``, ``kwargs`` and
    ``queue`` (None: any) is enqueued and not run yet."""
    path = _single_path(task)
    want_args, want_kwargs = _expected(args, kwargs)
    matches = [job for job in _jobs(path, NOT_RUN, backend) if not _differences(job, want_args, want_kwargs, queue)]
    if matches:
        lines = [f"expected no enqueued job of {_wanted(path, want_args, want_kwargs, queue)}, found {len(matches)}:"]
        lines += [f"  {job.describe()}" for job in matches]
        raise AssertionError("\n".join(lines))
