"""``drain()``: run enqueued jobs in the test's process, on the test's connection.

Inside Django's ``TestCase`` nothing commits, so a worker in another process
never sees the jobs a test enqueued. ``drain`` runs them here instead, one at
a time, inside the test's transaction, and writes each outcome the way a
worker does (status, return value, errors, attempts, worker ids, times), so
``result.refresh()``, ``get_result`` and ``context.parent_results`` read the
truth afterwards.

What a worker does that ``drain`` does not: leases, fences and shards (one
process, one connection: nothing to coordinate), concurrency and rate limits
(every job runs, one after another), timeouts and cancels of a running
attempt (``context.is_cancelled()`` is False, no deadline), and per-key
order is simply the order jobs run in.

Time: by default every READY job runs, whatever its ``run_after``, as if the
clock moved on to it: jobs due now first (by priority, as a worker claims
them), then the later ones in the order they fall due. A retry is READY again
with ``run_after`` = now + backoff, so ``drain`` runs it again, until the
job's ``max_attempts`` are used. ``until=`` runs only the jobs due by then
(``until=timezone.now()``: what a worker would run now; retries with a
backoff then wait).

State model of one job in a drain (as the worker's, without CLAIMED):

    READY ──start──▶ RUNNING ──returned──▶ SUCCESSFUL
                        │ ──raised, attempts left──▶ READY (run_after = now + backoff)
                        │ ──raised, none left──▶ FAILED
                        └──the task moved it itself (cancel, fenced completion)──▶ as it left it
    WAITING ──its parents finished (resolve_children)──▶ READY or FAILED (ParentFailed)
"""

import json
import logging
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections, transaction
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, Task, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import task_finished, task_started
from django.utils import timezone

from ..conf import get_config
from ..db import store
from ..db import testing as testing_store
from ..durable import Record
from ..exceptions import ResultTooLarge, ShardqError, UnknownTask
from ..tasks import Backoff, ShardTask, resolve
from ..worker.executor import ShardqTaskContext, sanitize_text, unstorable_json_text
from .durable import DrainedRun

logger = logging.getLogger("shardq.testing")

#: The worker id drain records in a job's ``worker_ids`` (one per attempt).
WORKER_ID = "shardq.testing.drain"

#: How many attempts one ``drain()`` runs before it decides the jobs never end.
DEFAULT_MAX_JOBS = 1000

DEFAULT_BACKOFF = Backoff()


class DrainLimitExceeded(ShardqError):
    """``drain()`` ran ``max_jobs`` attempts and READY jobs are still left:
    most likely a task that enqueues itself (or a cycle of tasks). ``report``
    holds what ran."""

    def __init__(self, message: str, report: "DrainReport") -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True, slots=True)
class RanJob:
    """One attempt ``drain()`` ran.

    ``status`` is what the attempt left: SUCCESSFUL, FAILED, or READY (it
    raised and will be retried after ``retry_in_seconds``). ``error`` and
    ``exception`` are set when it raised (``exception`` is the object itself,
    for ``raise``)."""

    id: str
    task_path: str
    queue_name: str
    attempt: int
    status: TaskResultStatus
    return_value: Any = None
    error: TaskError | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    retry_in_seconds: float | None = None
    backend: str = DEFAULT_TASK_BACKEND_ALIAS

    @property
    def result(self) -> TaskResult:
        """The job's ``TaskResult``, read from the table now."""
        return task_backends[self.backend].get_result(self.id)

    def __str__(self) -> str:
        what = f"job {self.id} {self.task_path} (queue {self.queue_name!r}) attempt {self.attempt}: {self.status}"
        if self.status == TaskResultStatus.SUCCESSFUL:
            return f"{what} -> {_short(self.return_value)}"
        if self.error is not None:
            last = self.error.traceback.strip().splitlines()[-1:] or [self.error.exception_class_path]
            retry = f", retry in {self.retry_in_seconds:.1f}s" if self.status == TaskResultStatus.READY else ""
            return f"{what} ({last[0]}{retry})"
        return what


class DrainReport(list[RanJob]):
    """What one ``drain()`` ran, in the order it ran it (a list of ``RanJob``,
    one per attempt: a retried job appears once per attempt)."""

    @property
    def succeeded(self) -> list[RanJob]:
        return [ran for ran in self if ran.status == TaskResultStatus.SUCCESSFUL]

    @property
    def failed(self) -> list[RanJob]:
        """The attempts that ended their job FAILED (no attempt left)."""
        return [ran for ran in self if ran.status == TaskResultStatus.FAILED]

    @property
    def retried(self) -> list[RanJob]:
        """The attempts that raised and left their job READY for another."""
        return [ran for ran in self if ran.status == TaskResultStatus.READY]

    @property
    def ids(self) -> list[str]:
        """The job ids that ran, each once, in the order they first ran."""
        return list(dict.fromkeys(ran.id for ran in self))

    def __str__(self) -> str:
        if not self:
            return "drain ran no job"
        counts = Counter(ran.status for ran in self)
        summary = ", ".join(f"{counts[s]} {s}" for s in ("SUCCESSFUL", "READY", "FAILED") if counts[s])
        return f"drain ran {len(self)} attempts ({summary}):\n" + "\n".join(f"  {ran}" for ran in self)


def drain(
    queue: str | Iterable[str] | None = None,
    task: Task | str | Iterable[Task | str] | None = None,
    *,
    until: datetime | None = None,
    max_jobs: int = DEFAULT_MAX_JOBS,
    raise_errors: bool = False,
    run_on_commit: bool = True,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
) -> DrainReport:
    """Run the READY jobs (of ``queue`` and ``task``, when given) in this
    process, on the test's connection and inside its transaction, until none
    is left; return what ran.

    It follows what the jobs lead to: retries (attempts left after a raise),
    jobs the tasks enqueue, and workflow children, which become READY (or
    FAILED with ParentFailed) as their parents finish. ``until`` (a datetime)
    runs only the jobs due by then; by default a job's ``run_after`` is no
    reason to wait (see the module's docstring). ``max_jobs`` bounds the
    attempts: past it, ``DrainLimitExceeded``. ``raise_errors`` re-raises a
    task's exception once its outcome is written (the drain stops there).
    ``run_on_commit``: ``transaction.on_commit`` callbacks a task registers
    run when it ends, as they would in a worker (where the task runs outside
    the test's transaction, whose commit never comes). ``backend`` is the
    ``TASKS`` alias whose database is drained.
    """
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
        raise ValueError(f"max_jobs must be a positive int, not {max_jobs!r}")
    if until is not None and (not isinstance(until, datetime) or timezone.is_naive(until)):
        raise ValueError(f"until must be a timezone-aware datetime (e.g. timezone.now()), not {until!r}")
    return _Drain(
        _shardq_backend(backend),
        queues=_queue_names(queue),
        task_paths=task_paths(task),
        until=until,
        max_jobs=max_jobs,
        raise_errors=raise_errors,
        run_on_commit=run_on_commit,
    ).run()


async def adrain(
    queue: str | Iterable[str] | None = None,
    task: Task | str | Iterable[Task | str] | None = None,
    **options: Any,
) -> DrainReport:
    """``drain`` from async code (an ``async def`` test method of Django's
    ``TestCase``): runs it in the thread that holds the test's connection."""
    return await sync_to_async(drain, thread_sensitive=True)(queue, task, **options)


def _shardq_backend(alias: str) -> Any:
    found = task_backends[alias]
    if not hasattr(found, "database_alias") or not hasattr(found, "result_from_row"):
        raise ValueError(
            f"TASKS[{alias!r}] is {type(found).__name__}, not shardq's backend: shardq.testing drains "
            "shardq.backend.ShardqBackend's jobs (pass backend= the alias of one)."
        )
    return found


def _queue_names(queue: str | Iterable[str] | None) -> list[str] | None:
    if queue is None:
        return None
    names = [queue] if isinstance(queue, str) else list(queue)
    bad = [name for name in names if not isinstance(name, str)]
    if bad or not names:
        raise ValueError(f"queue must be a queue name or a list of them, not {queue!r}")
    return names


def task_paths(task: Task | str | Iterable[Task | str] | None) -> list[str] | None:
    """The task paths ``task`` names (a Task, its module path, or a list of
    either); None for None (every task)."""
    if task is None:
        return None
    items = [task] if isinstance(task, (Task, str)) or not isinstance(task, Iterable) else list(task)
    paths = []
    for item in items:
        if isinstance(item, Task):
            paths.append(item.module_path)
        elif isinstance(item, str) and "." in item:
            paths.append(item)
        else:
            raise ValueError(
                f"task must be a task (a @task or @shard_task function), its module path "
                f"('app.tasks.name') or a list of them, not {item!r}"
            )
    if not paths:
        raise ValueError("task is an empty list: name a task, or pass None for every task")
    return paths


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _class_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _json(value: Any) -> Any:
    """A jsonb column as Django's cursor returns it (text), decoded."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _task_error(entry: Any) -> TaskError:
    if isinstance(entry, dict) and set(entry) == {"exception_class_path", "traceback"}:
        return TaskError(exception_class_path=str(entry["exception_class_path"]), traceback=str(entry["traceback"]))
    return TaskError(exception_class_path="shardq.exceptions.UnreadableJob", traceback=f"an error entry: {entry!r}")


def _sender(alias: str) -> type:
    """The signals' sender, as the worker sends them: the class of the
    configured backend ``alias`` (BaseTaskBackend for one not configured here)."""
    try:
        return type(task_backends[alias])
    except InvalidTaskBackend:
        return BaseTaskBackend


def _in_failed_transaction(connection: Any) -> bool:
    """Is the connection's transaction aborted (a statement of the task failed in it)?"""
    from psycopg.pq import TransactionStatus

    raw = connection.connection
    return bool(connection.needs_rollback) or (
        raw is not None and raw.info.transaction_status == TransactionStatus.INERROR
    )


class _Drain:
    def __init__(self, backend: Any, **options: Any) -> None:
        self.backend = backend
        self.using: str = backend.database_alias
        self.queues: list[str] | None = options["queues"]
        self.task_paths: list[str] | None = options["task_paths"]
        self.until: datetime | None = options["until"]
        self.max_jobs: int = options["max_jobs"]
        self.raise_errors: bool = options["raise_errors"]
        self.run_on_commit: bool = options["run_on_commit"]
        self.config = get_config()
        self.report = DrainReport()
        self._shards_ensured = False
        # Durable jobs' records (step outputs, cursors) by job id, kept for
        # their later attempts in this drain (shardq/testing/durable.py), and
        # the last run's, kept unless its transaction failed.
        self._durable_records: dict[int, dict[str, Record]] = {}
        self._last_run: DrainedRun | None = None
        # Set when an outcome written was a workflow parent's.
        self._parent_finished = False

    def _filters(self) -> dict[str, Any]:
        return {"queues": self.queues, "task_paths": self.task_paths, "until": self.until}

    def run(self) -> DrainReport:
        # Parents finished before the drain (a cancel, an earlier drain of
        # another queue) have children to move on first, as a resolver would.
        testing_store.resolve_parents(self.using)
        while True:
            if len(self.report) >= self.max_jobs:
                if testing_store.has_candidate(self.using, **self._filters()) or (
                    testing_store.resolve_parents(self.using)
                    and testing_store.has_candidate(self.using, **self._filters())
                ):
                    raise DrainLimitExceeded(self._limit_message(), self.report)
                return self.report
            row = testing_store.start_next_job(self.using, worker=WORKER_ID, **self._filters())
            if row is None:
                if testing_store.resolve_parents(self.using):
                    continue
                return self.report
            self._run_job(row)
            if self._parent_finished:
                # As a worker's resolver, woken by the ack: the children are
                # READY before the next job is picked, and take their place
                # by priority among the jobs due.
                self._parent_finished = False
                testing_store.resolve_parents(self.using)

    def _limit_message(self) -> str:
        most = Counter(ran.task_path for ran in self.report).most_common(3)
        tasks = ", ".join(f"{path} ×{n}" for path, n in most)
        return (
            f"drain() ran max_jobs={self.max_jobs} attempts and READY jobs are still left: a task that "
            f"enqueues itself (or tasks that enqueue each other) never drains. Run most: {tasks}. "
            "Pass max_jobs= a larger number if the test really runs more."
        )

    # -- one job -------------------------------------------------------------

    def _run_job(self, row: dict[str, Any]) -> None:
        rank = row["status_rank"] + 1
        try:
            task = resolve(row["task_path"], self.config.task_modules)
        except UnknownTask as exc:
            error = TaskError(exception_class_path=_class_path(exc), traceback=f"{_class_path(exc)}: {exc}\n")
            self._finish(row, rank, "FAILED", error=error)
            self._record(row, TaskResultStatus.FAILED, error=error, exception=exc)
            if self.raise_errors:
                raise
            return
        result = self._result(task, row)
        task_started.send(sender=_sender(result.backend), task_result=result)
        connection = connections[self.using]
        callbacks_from = len(connection.run_on_commit)
        # A savepoint inside the test's transaction, so a task whose SQL
        # failed (which aborts the whole transaction in PostgreSQL) leaves the
        # test's transaction usable; None outside a transaction.
        savepoint = transaction.savepoint_create(using=self.using)
        try:
            try:
                value = self._call(task, row, result)
            except BaseException:
                failed = _in_failed_transaction(connection)
                self._settle(connection, savepoint, callbacks_from, rolled_back=failed)
                self._keep_durable_records(kept=not failed)
                raise
            self._settle(connection, savepoint, callbacks_from, rolled_back=False)
            self._keep_durable_records(kept=True)
            value_json = self._encode(value)
        except BaseException as error:
            # Handled inside the except block, as the worker does, so
            # task_finished receivers (Django's own logs the traceback) see it.
            self._failed(task, row, rank, result, error)
            if self.raise_errors:
                raise
            return
        if self._finish(row, rank, "SUCCESSFUL", return_value_json=value_json) is None:
            self._moved_on(row, result)
            return
        object.__setattr__(result, "_return_value", json.loads(value_json))
        self._finished(result, TaskResultStatus.SUCCESSFUL)
        self._record(row, TaskResultStatus.SUCCESSFUL, return_value=json.loads(value_json))

    def _settle(self, connection: Any, savepoint: str | None, callbacks_from: int, *, rolled_back: bool) -> None:
        """End the task's savepoint (rolled back when its transaction
        failed, released otherwise) and run the on_commit callbacks it
        registered: in a worker it runs outside any transaction of the test,
        where they would have run by now."""
        if savepoint is not None:
            if rolled_back:
                transaction.savepoint_rollback(savepoint, using=self.using)
                connection.needs_rollback = False
                # Its callbacks belonged to the work just undone.
                del connection.run_on_commit[callbacks_from:]
            else:
                transaction.savepoint_commit(savepoint, using=self.using)
        if self.run_on_commit and connection.in_atomic_block:
            # Taken off the connection's list as they run: the test's own
            # captureOnCommitCallbacks(execute=True) must not run them again.
            # A callback may register more: they run too, in order.
            while len(connection.run_on_commit) > callbacks_from:
                _sids, func, robust = connection.run_on_commit.pop(callbacks_from)
                if robust:
                    try:
                        func()
                    except Exception as exc:
                        logger.error("a robust on_commit callback of a drained task raised: %s", exc, exc_info=exc)
                else:
                    func()

    def _call(self, task: Task, row: dict[str, Any], result: TaskResult) -> Any:
        args, kwargs = _json(row["args"]), _json(row["kwargs"])
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise TypeError(f"job {row['id']}'s arguments in the table are not a JSON list and object")
        if task.takes_context:
            self._ensure_shards()
            # Durable calls for sync tasks, as a worker gives them.
            self._last_run = None
            if not iscoroutinefunction(task.func):
                kept = dict(self._durable_records.get(row["id"], {}))
                self._last_run = DrainedRun(job_id=row["id"], using=self.using, kept=kept)
            context = ShardqTaskContext(
                task_result=result,
                fence=row["fence"],
                shard=row["shard"],
                rank=row["status_rank"] + 1,
                durable=self._last_run,
                is_async=iscoroutinefunction(task.func),
            )
            args = [context, *args]
        if iscoroutinefunction(task.func):
            # The coroutine runs on an event loop of asgiref's; its ORM calls
            # (sync_to_async) come back to this thread, so to the test's connection.
            return async_to_sync(task.func)(*args, **kwargs)
        try:
            return task.func(*args, **kwargs)
        finally:
            if self._last_run is not None:
                # A walk left open (the task raised or returned in it): its batch rolls back.
                self._last_run.close()

    def _keep_durable_records(self, *, kept: bool) -> None:
        """The last run's durable records stay for the job's next attempt,
        unless its transaction failed (its savepoint, and its batches' writes,
        rolled back)."""
        run, self._last_run = self._last_run, None
        if run is not None and kept:
            self._durable_records[run.job_id] = run.records()

    def _ensure_shards(self) -> None:
        # shardq.fenced / complete_in_transaction check the job's fence
        # against its shard's lease row (claim version 0 before any worker
        # claimed it): post_migrate makes the rows, a TransactionTestCase's
        # flush may have removed them.
        if not self._shards_ensured:
            store.ensure_shards(using=self.using)
            self._shards_ensured = True

    def _encode(self, value: Any) -> str:
        """The return value as the JSON a worker would store, or the job's error."""
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        if len(text) > self.config.max_result_bytes:
            raise ResultTooLarge(
                f"the return value is {len(text)} bytes of JSON, over SHARDQ['MAX_RESULT_BYTES'] = "
                f"{self.config.max_result_bytes}: store large results elsewhere (a model, a file) and return its id"
            )
        if "\\u" in text:
            unstorable = unstorable_json_text(value)
            if unstorable:
                raise ValueError(f"the return value is not storable as JSON in PostgreSQL: {unstorable}")
        return text

    def _failed(self, task: Task, row: dict[str, Any], rank: int, result: TaskResult, error: BaseException) -> None:
        path = _class_path(error)
        text = sanitize_text("".join(traceback.format_exception(error)))
        if isinstance(error, (TypeError, ValueError)) and "is not JSON serializable" in str(error):
            text = f"the return value is not JSON ({error}); return str, int, float, bool, None, list or dict\n" + text
        task_error = TaskError(exception_class_path=path, traceback=text)
        # As the worker: a BaseException that is not an Exception (SystemExit,
        # KeyboardInterrupt) is the job's failure, never retried.
        retry = isinstance(task, ShardTask) and row["attempts"] < row["max_attempts"] and isinstance(error, Exception)
        delay = (getattr(task, "backoff", None) or DEFAULT_BACKOFF).delay(row["attempts"]) if retry else None
        status = TaskResultStatus.READY if retry else TaskResultStatus.FAILED
        # One line a failed attempt, as the worker logs it (pytest shows it
        # with a failing test's captured log).
        line = " ".join(f"{type(error).__qualname__}: {error}".split())[:500]
        failed = (
            f"job {row['id']} ({row['task_path']}) failed: {line}; attempt {row['attempts']} of {row['max_attempts']}"
        )
        if retry:
            logger.warning("%s, drain runs it again (backoff %.1fs)", failed, delay)
        else:
            logger.error("%s, no retry left: FAILED", failed)
        moved = self._finish(row, rank, status, error=task_error, delay_seconds=delay or 0.0)
        if moved is None:
            self._moved_on(row, result)
            return
        result.errors.append(task_error)
        self._finished(result, status)
        self._record(row, status, error=task_error, exception=error, retry_in_seconds=delay)

    def _finish(
        self,
        row: dict[str, Any],
        rank: int,
        status: str,
        *,
        return_value_json: str | None = None,
        error: TaskError | None = None,
        delay_seconds: float = 0.0,
    ) -> bool | None:
        error_json = (
            None
            if error is None
            else json.dumps({"exception_class_path": error.exception_class_path, "traceback": error.traceback})
        )
        written = testing_store.finish_job(
            self.using,
            row["id"],
            rank=rank,
            status=str(status),
            return_value_json=return_value_json,
            error_json=error_json,
            delay_seconds=delay_seconds,
        )
        self._parent_finished = self._parent_finished or bool(written)
        return written

    def _moved_on(self, row: dict[str, Any], result: TaskResult) -> None:
        """The task moved its own job on (``shardq.cancel``, a fenced
        completion): report what the table holds, write nothing."""
        now = self.backend.get_result(str(row["id"]))
        object.__setattr__(result, "errors", list(now.errors))
        if now.status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", now.return_value)
        self._finished(result, now.status)
        self._record(
            row,
            now.status,
            return_value=now.return_value if now.status == TaskResultStatus.SUCCESSFUL else None,
            error=now.errors[-1] if now.errors and now.status == TaskResultStatus.FAILED else None,
        )

    def _result(self, task: Task, row: dict[str, Any]) -> TaskResult:
        return TaskResult(
            task=task,
            id=str(row["id"]),
            status=TaskResultStatus.RUNNING,
            enqueued_at=row["enqueued_at"],
            started_at=row["started_at"],
            finished_at=None,
            last_attempted_at=row["last_attempted_at"],
            args=_json(row["args"]),
            kwargs=_json(row["kwargs"]),
            backend=row["backend"],
            errors=[_task_error(e) for e in _json(row["errors"]) or []],
            worker_ids=[str(w) for w in _json(row["worker_ids"])],
        )

    def _finished(self, result: TaskResult, status: TaskResultStatus) -> None:
        object.__setattr__(result, "status", status)
        if status != TaskResultStatus.READY:  # a retry has not finished
            object.__setattr__(result, "finished_at", timezone.now())
        task_finished.send(sender=_sender(result.backend), task_result=result)

    def _record(self, row: dict[str, Any], status: TaskResultStatus, **fields: Any) -> None:
        self.report.append(
            RanJob(
                id=str(row["id"]),
                task_path=row["task_path"],
                queue_name=row["queue_name"],
                attempt=row["attempts"],
                status=TaskResultStatus(status),
                backend=row["backend"],
                **fields,
            )
        )
