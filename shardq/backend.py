"""shardq's Django Tasks backend: ``TASKS = {"default": {"BACKEND":
"shardq.backend.ShardqBackend", ...}}``.

``enqueue`` inserts the job on the caller's own database connection, so inside
``transaction.atomic()`` the job exists exactly when the caller commits.
Arguments and results are JSON, never pickles.

The statements run through ``shardq/db/enqueue.py``: ``enqueue`` runs
``insert_job`` as a server-side prepared statement on the caller's own
connection (Django's default client-side-binding cursor makes the server
parse and plan every INSERT, and a new cursor per statement costs more
client time than the rest of the statement's Python side);
``TASKS[...]["OPTIONS"]["PREPARED_STATEMENTS"] = False`` turns preparing off
(a transaction-mode pooler that does not track protocol-level prepared
statements, e.g. PgBouncer < 1.21). ``enqueue_many`` COPYs the rows in one
atomic block (a savepoint within the caller's transaction): a failure
stores nothing.

What lives beside the backend (``shardq/enqueue/``): the argument checks
(``arguments.py``), a call's row (``rows.py``), the TaskResults
(``results.py``), unique tasks, which take their own branch so the plain
path stays as it is (``unique.py``, with its cache), and graphs of jobs
(``graph.py``).
"""

import logging

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.tasks import TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import log_task_enqueued, task_enqueued

from . import tracing
from .checks import backend_checks, refuse_without_app, unusable
from .conf import get_config
from .db import enqueue as enqueue_statements
from .db import operations
from .dispatch import SignalGate
from .enqueue.arguments import MAX_ARGUMENT_DEPTH, check_run_after, validate_stored_names
from .enqueue.graph import enqueue_after, enqueue_graph
from .enqueue.results import new_result, parse_job_id, result_from_row
from .enqueue.rows import JobRows
from .enqueue.unique import UniqueJobs, unique_cache_size
from .limits import queue_limits
from .tasks import ShardTask, register, validate_shard_options
from .worker import metrics

# Documented (docs/configuration.md) as shardq.backend.MAX_ARGUMENT_DEPTH.
__all__ = ["MAX_ARGUMENT_DEPTH", "ShardqBackend"]

# Task objects whose validation each backend remembers (``.using()`` makes a
# new one per call; the memory is emptied when full).
_KNOWN_TASKS = 256


class ShardqBackend(BaseTaskBackend):
    task_class = ShardTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        self.database_alias = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        # Off by default behind a transaction pool that Django is told of
        # (DISABLE_SERVER_SIDE_CURSORS): a statement prepared on one server
        # connection is unknown on the next (docs/scaling.md, "PgBouncer").
        pooled = bool((connections.settings.get(self.database_alias) or {}).get("DISABLE_SERVER_SIDE_CURSORS"))
        self.prepared_statements = bool(self.options.get("PREPARED_STATEMENTS", not pooled))
        self.config = get_config()
        # SHARDQ["QUEUES"]' limits (validated at start by the app's ready()).
        self.queue_limits = queue_limits()
        self.rows = JobRows(self.alias, self.config, self.queue_limits)
        # get_result keeps no cache of its own: a SUCCESSFUL result does not
        # change, but its row can go (shardq_prune, a DELETE), and Django's
        # contract is TaskResultDoesNotExist then, in every process.
        # id(task) -> (task, its task_params): validated once per Task object
        # (identity checked). A plain dict, emptied when full, read without
        # a lock (an LRU reorders on every read).
        self._known_tasks: dict[int, tuple] = {}
        # An invalid UNIQUE_CACHE_SIZE is reported by the check shardq.E007
        # and treated as the default here.
        self.unique = UniqueJobs(
            self.database_alias,
            self.prepared_statements,
            unique_cache_size(self.options),
            get_result=self.get_result,
            new_result=self._new_result,
        )
        self._enqueued_gate = SignalGate(task_enqueued, log_task_enqueued)

    # -- definition time ----------------------------------------------------

    def validate_task(self, task):
        refuse_without_app(self)  # shardq.E009, when the task is defined
        check_run_after(task)
        if self.queues and task.queue_name not in self.queues:
            # Django's own message names neither the task nor the queues.
            raise InvalidTask(
                f"Task {task.module_path} has queue_name {task.queue_name!r}, which is not in "
                f"TASKS[{self.alias!r}]['QUEUES'] = {sorted(self.queues)!r}: use one of those queues, "
                "or add this one to QUEUES."
            )
        super().validate_task(task)
        validate_stored_names(task)
        validate_shard_options(task)
        register(task)

    def check(self, **kwargs):
        yield from backend_checks(self)

    # -- enqueue ------------------------------------------------------------

    def enqueue(self, task, args, kwargs):
        if tracing.enabled:  # a PRODUCER span, its context stored with the job (shardq/tracing.py)
            with tracing.enqueue_span(task, args, kwargs) as span:
                result = self._enqueue(task, args, kwargs, tracing.traceparent(span))
                tracing.enqueued(span, [result.id])
                return result
        return self._enqueue(task, args, kwargs, None)

    def _enqueue(self, task, args, kwargs, traceparent: str | None):
        params = self._validate_once(task)
        if isinstance(task, ShardTask) and task.after:
            return enqueue_after(task, [(args, kwargs)])[0]
        params.update(self.rows.job_row(task, args, kwargs))  # refused even for a unique duplicate
        params["traceparent"] = traceparent
        if isinstance(task, ShardTask) and task.unique_for is not None:
            result, inserted = self.unique.enqueue(task, args, kwargs, params)
            self._send_enqueued([result] if inserted else [])
            return result
        try:
            job_id, enqueued_at, run_after, _ = enqueue_statements.fetch_one(
                self.database_alias, "insert_job", params, prepared=self.prepared_statements
            )
        except DatabaseError:
            self._drop_broken_connection()
            raise
        result = self._new_result(task, job_id, enqueued_at, run_after, args, kwargs)
        self._send_enqueued([result])
        return result

    def enqueue_many(self, task, calls) -> list[TaskResult]:
        """Enqueue many calls of one task: ids from the sequence, one COPY and one
        NOTIFY per distinct shard, in one atomic block (see shardq.enqueue_many)."""
        calls = [(tuple(args), dict(kwargs)) for args, kwargs in calls]
        if tracing.enabled and calls:  # one PRODUCER span for the call, its context in every row
            with tracing.enqueue_span(task, jobs=len(calls)) as span:
                return self._enqueue_many(task, calls, tracing.traceparent(span))
        return self._enqueue_many(task, calls, None)

    def _enqueue_many(self, task, calls: list[tuple[tuple, dict]], traceparent: str | None) -> list[TaskResult]:
        params = self._validate_once(task)
        params["traceparent"] = traceparent
        if not calls:
            return []
        if isinstance(task, ShardTask) and task.after:
            return enqueue_after(task, calls)
        if isinstance(task, ShardTask) and task.unique_for is not None:
            results, inserted = self.unique.enqueue_many(
                task, calls, lambda args, kwargs: {**params, **self.rows.job_row(task, args, kwargs)}
            )
            self._send_enqueued(inserted)
            return results
        rows = [self.rows.job_row(task, args, kwargs) for args, kwargs in calls]
        run_after = params["run_after"]
        build = self._new_result
        results = []

        def on_job(index: int, job_id: int, enqueued_at) -> None:
            # Built while the server takes in the rows; an error here rolls
            # the COPY back with the rest.
            args, kwargs = calls[index]
            results.append(build(task, job_id, enqueued_at, run_after, args, kwargs))

        enqueue_statements.copy_jobs(
            self.database_alias,
            params,
            rows,
            notify=self.config.notify,
            channel=self.config.channel,
            on_job=on_job,
        )
        self._send_enqueued(results)
        return results

    def enqueue_graph(self, steps, workflow: str | None = None) -> list[TaskResult]:
        """A workflow's steps in one atomic block (``shardq/enqueue/graph.py``)."""
        if tracing.enabled:
            with tracing.workflow_span(len(steps), workflow):
                return self._enqueue_graph(steps, workflow)
        return self._enqueue_graph(steps, workflow)

    def _enqueue_graph(self, steps, workflow: str | None) -> list[TaskResult]:
        results = enqueue_graph(
            steps,
            task_params=self._validate_once,
            job_row=self.rows.job_row,
            new_result=self._new_result,
            database_alias=self.database_alias,
            notify=self.config.notify,
            channel=self.config.channel,
            workflow=workflow,
        )
        self._send_enqueued(results)
        return results

    def _validate_once(self, task) -> dict:
        """validate_task, once per Task object: a Task is immutable and this
        backend's queues are fixed, so the answer cannot change (Django's
        checks inspect the function's signature, which costs more than the
        rest of an enqueue). Returns a copy of the task's ``task_params``."""
        known = self._known_tasks.get(id(task))
        if known is None or known[0] is not task:
            # Once per task, as the rest: the app missing or SQLite is a clear
            # error here rather than a missing table or a syntax error.
            problem = unusable(self)
            if problem:
                raise ImproperlyConfigured(problem)
            self.validate_task(task)
            if len(self._known_tasks) >= _KNOWN_TASKS:
                self._known_tasks.clear()
            known = self._known_tasks[id(task)] = (task, self.rows.task_params(task))
        return known[1].copy()

    def _new_result(self, task, job_id, enqueued_at, run_after, args, kwargs) -> TaskResult:
        return new_result(task, job_id, enqueued_at, run_after, args, kwargs, self.alias)

    def _send_enqueued(self, results: list[TaskResult]) -> None:
        """``task_enqueued`` for each job this enqueue stored (not for a
        duplicate of a unique one), when anyone listens (SignalGate)."""
        if results and self._enqueued_gate.needed(logging.DEBUG):
            for result in results:
                task_enqueued.send(type(self), task_result=result)

    def _drop_broken_connection(self) -> None:
        """After a failed enqueue outside a transaction, close the connection
        if the server is gone (a crash, a failover): Django closes a broken
        connection only at a request's start and end, so a process without
        a request cycle (a script, a consumer loop, a task) would otherwise
        fail every enqueue until it restarts. The next enqueue connects
        again — with a multi-host DATABASE_URL and
        ``target_session_attrs=read-write``, to the new primary
        (docs/scaling.md, "PostgreSQL failover"). Inside ``atomic()`` the
        caller's transaction is lost anyway and Django's own rules apply."""
        conn = connections[self.database_alias]
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()

    # -- results ------------------------------------------------------------

    def get_result(self, result_id):
        job_id = parse_job_id(result_id)
        if job_id is None:
            raise TaskResultDoesNotExist(f"No shardq job has the id {result_id!r}.")
        row = operations.run("get_job", {"id": job_id}, using=self.database_alias, fetch="one", named=True)
        if row is None:
            raise TaskResultDoesNotExist(f"No shardq job has the id {result_id!r}.")
        return self.result_from_row(row)

    def cancel(self, result_ids, reason: str = "") -> list[str]:
        """Cancel jobs that have not finished (see ``shardq.cancel``); returns
        the ids cancelled. Runs on the caller's connection and transaction."""
        ids = []
        for result_id in result_ids:
            job_id = parse_job_id(result_id)
            if job_id is None:
                raise TaskResultDoesNotExist(
                    f"{result_id!r} is not a shardq job id (the decimal id of a TaskResult, e.g. result.id)."
                )
            ids.append(job_id)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, not {type(reason).__name__}")
        if not ids:
            return []
        rows = operations.run("cancel_jobs", {"ids": ids, "reason": reason}, using=self.database_alias)
        if metrics.active is not None and metrics.active.enqueue_side:
            metrics.active.count_cancelled({"queue_name": queue, "task_path": path} for _, queue, path in rows)
        return [str(job_id) for job_id in sorted(row[0] for row in rows)]

    def result_from_row(self, row) -> TaskResult:
        """The TaskResult of a ``get_job`` row (``shardq/enqueue/results.py``)."""
        return result_from_row(row, self.alias, self.config.task_modules)
