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

Unique tasks (``unique_for=``) take their own branch, so the plain path
above stays as it is:

* ``enqueue`` runs ``insert_unique_job`` (prepared the same way): one
  statement takes the key in ``shardq_unique`` and inserts the job only when
  it got the key; otherwise it returns the holder's id, and ``get_result``
  reads the holder (a second statement: the holder may have committed after
  the first statement's snapshot). The key row is written in the caller's
  transaction, so the key is taken exactly when the job exists; a second
  enqueue of the key in another transaction waits for that one to commit or
  roll back.
* A process-local LRU (``OPTIONS["UNIQUE_CACHE_SIZE"]``) remembers recently
  seen keys: key -> (local monotonic deadline, the holder's ``TaskResult``).
  A duplicate found there before its deadline is answered without a query,
  with a copy of the holder's result as this process last saw it (status
  READY after its own insert; ``refresh()`` reads the table). Two rules keep
  the cache from ever refusing an enqueue the database would accept:
  an entry is added only for committed knowledge (the holder the database
  named, or this process's own insert, both through ``on_commit`` of the
  database alias: immediately in autocommit, at COMMIT inside ``atomic()``,
  never after a rollback), and its deadline is the database's remaining TTL
  counted from when the statement was *sent*, minus
  ``UNIQUE_CACHE_MARGIN_SECONDS`` (clock rate differences); a key with less
  left than that is not cached. Deleting a job frees its key in the database
  at the next enqueue of that key (``release_unique_key``), but a process
  that cached the key answers with the deleted job until its deadline.
"""

import copy
import json
import logging
import random
import re
import threading
import time
from dataclasses import fields as dataclass_fields
from datetime import datetime, timedelta
from functools import partial

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import log_task_enqueued, task_enqueued
from django.utils.json import normalize_json

from .checks import backend_checks, unusable
from .conf import get_config
from .core.hashing import salted_key_hash, shard_key_hash
from .core.lru import make_lru
from .db import enqueue as enqueue_statements
from .db import operations
from .dispatch import SignalGate
from .exceptions import ArgumentNotJSON
from .limits import call_limits, queue_limits, static_keys
from .tasks import (
    ShardTask,
    bind_arguments,
    check_text,
    compute_shard_key,
    compute_unique_key,
    register,
    resolve,
    validate_shard_options,
)
from .tasks.keys import _short_repr
from .worker import metrics

# Default of OPTIONS["UNIQUE_CACHE_SIZE"]: recently seen unique keys kept (0: none).
UNIQUE_KEYS_CACHED = 1024
# A cached unique key is trusted until this long before the database's expiry
# (counted from when the statement was sent): room for the local monotonic
# clock and the database's clock to run at slightly different rates.
UNIQUE_CACHE_MARGIN_SECONDS = 1.0
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
        self.prepared_statements = bool(self.options.get("PREPARED_STATEMENTS", True))
        self.config = get_config()
        # SHARDQ["QUEUES"]' limits (validated at start by the app's ready()).
        self.queue_limits = queue_limits()
        # get_result keeps no cache of its own: a SUCCESSFUL result does not
        # change, but its row can go (shardq_prune, a DELETE), and Django's
        # contract is TaskResultDoesNotExist then, in every process.
        # Guards every LRU of this backend (they are not thread-safe, and
        # even a get reorders).
        self._finished_lock = threading.Lock()
        # id(task) -> (task, its task_params): validated once per Task object
        # (identity checked). A plain dict, emptied when full, read without
        # a lock (an LRU reorders on every read).
        self._known_tasks: dict[int, tuple] = {}
        # Unique key -> (monotonic deadline, holder's TaskResult), committed
        # knowledge only (see the module docstring). An invalid size is
        # reported by the check shardq.E007 and treated as the default here.
        size = unique_cache_size(self.options)
        self._unique = make_lru(size) if size else None
        self._enqueued_gate = SignalGate(task_enqueued, log_task_enqueued)

    # -- definition time ----------------------------------------------------

    def validate_task(self, task):
        check_run_after(task)
        super().validate_task(task)
        validate_stored_names(task)
        validate_shard_options(task)
        register(task)

    def check(self, **kwargs):
        yield from backend_checks(self)

    # -- enqueue ------------------------------------------------------------

    def job_row(self, task, args, kwargs) -> dict:
        """Validate one call and build its row (raises InvalidTask, stores nothing)."""
        bind_arguments(task, args, kwargs)
        args_json = dump_arguments(task, args, kwargs)
        kwargs_json = dump_keyword_arguments(task, kwargs)
        size = len(args_json) + len(kwargs_json)
        if size > self.config.max_payload_bytes:
            raise InvalidTask(
                f"{task.module_path}: the arguments are {size} bytes of JSON, over "
                f"SHARDQ['MAX_PAYLOAD_BYTES'] = {self.config.max_payload_bytes}. Store large "
                "data elsewhere (a model, a file) and pass its id."
            )
        key = compute_shard_key(task, args, kwargs)  # checked text (tasks.key_to_str)
        if key is None:
            key_hash = random.getrandbits(32) - 2**31
        else:
            try:
                if isinstance(task, ShardTask) and task.salt:
                    # A hot key: one of its sub-keys at random (the row keeps the key).
                    key_hash = salted_key_hash(key, random.randrange(task.salt))
                else:
                    key_hash = shard_key_hash(key)
            except UnicodeEncodeError:  # key_to_str refuses these; a key set some other way
                check_text(key, f"{task.module_path}: the shard key")
                raise
        # No shard here: the statement that writes the row computes it from
        # the cluster's current shard count (shardq_cluster), which an online
        # reshard changes (the insert statements, or reserve_job_ids for COPY).
        row = {
            "key_hash": key_hash,
            "shard_key": key,
            "args": args_json,
            "kwargs": kwargs_json,
        }
        if getattr(task, "limit_by", None) is not None:
            # A partitioned limit: its key depends on this call's value, and
            # one partitioned by the shard key is kept by the key's owner.
            keys, row["key_limited"] = call_limits(task, args, kwargs, key, self.queue_limits)
            row["limit_keys"] = None if keys is None else json.dumps(keys)
        return row

    def task_params(self, task) -> dict:
        is_shard_task = isinstance(task, ShardTask)
        return {
            "task_path": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            # Django's check lets a whole-number float or a bool through
            # (1.0, True); the column is a smallint.
            "priority": int(task.priority),
            "run_after": task.run_after,
            "ordered": is_shard_task and task.ordered,
            "max_attempts": task.max_attempts if is_shard_task else 1,
            "channel": self.config.channel,
            "notify": self.config.notify,
            # Only when the cluster row is missing (shard_count_now).
            "shard_count": self.config.shard_count,
            # The limits every call of the task counts against (docs/limits.md);
            # job_row replaces it for a task limited per argument value.
            "limit_keys": _json_or_none(static_keys(task, self.queue_limits)),
            "key_limited": False,
        }

    def enqueue(self, task, args, kwargs):
        params = self._validate_once(task)
        if isinstance(task, ShardTask) and task.after:
            # task.using(after=[...]): a graph of one job, WAITING on jobs that exist.
            from .workflows import Workflow

            workflow = Workflow()
            workflow.add(task, *args, after=list(task.after), on_parent_failure=task.on_parent_failure, **kwargs)
            return workflow.enqueue()[0]
        if isinstance(task, ShardTask) and task.unique_for is not None:
            return self._enqueue_unique(task, args, kwargs)
        params.update(self.job_row(task, args, kwargs))
        try:
            job_id, enqueued_at, run_after, _ = enqueue_statements.fetch_one(
                self.database_alias, "insert_job", params, prepared=self.prepared_statements
            )
        except DatabaseError:
            self._drop_broken_connection()
            raise
        result = self._new_result(task, job_id, enqueued_at, run_after, args, kwargs)
        if self._enqueued_gate.needed(logging.DEBUG):
            task_enqueued.send(type(self), task_result=result)
        return result

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
            known = self._known_tasks[id(task)] = (task, self.task_params(task))
        return known[1].copy()

    # -- unique tasks ---------------------------------------------------------

    def _enqueue_unique(self, task, args, kwargs):
        """enqueue() of a unique task: the holder's result when the key is
        taken (from the LRU or the database), else a new job's."""
        params = self.task_params(task)
        params.update(self.job_row(task, args, kwargs))  # bad input is refused even for a duplicate
        unique_key = compute_unique_key(task, args, kwargs)
        cached = self._cached_unique(unique_key)
        if cached is not None:
            return cached
        result, inserted = self._insert_unique(task, args, kwargs, params, unique_key)
        if inserted and self._enqueued_gate.needed(logging.DEBUG):
            task_enqueued.send(type(self), task_result=result)
        return result

    def _insert_unique(self, task, args, kwargs, params, unique_key):
        """Run insert_unique_job; return (result, whether a job was inserted)."""
        params["unique_key"] = unique_key
        params["unique_for"] = task.unique_for_seconds
        for attempt in range(2):
            sent = time.monotonic()
            job_id, inserted, remaining, enqueued_at, run_after, _ = enqueue_statements.fetch_one(
                self.database_alias, "insert_unique_job", params, prepared=self.prepared_statements
            )
            if inserted:
                result = self._new_result(task, job_id, enqueued_at, run_after, args, kwargs)
                break
            try:
                result = self.get_result(str(job_id))
                break
            except TaskResultDoesNotExist:
                # The holder committed (the statement saw it or waited for
                # it), so a holder this later statement cannot see was
                # deleted inside the TTL: free the key and take it (once).
                if attempt:
                    raise
                operations.run(
                    "release_unique_key",
                    {"unique_key": unique_key, "job_id": job_id},
                    using=self.database_alias,
                    fetch="none",
                )
        if self._unique is not None:
            deadline = sent + remaining - UNIQUE_CACHE_MARGIN_SECONDS
            if deadline > time.monotonic():
                conn = connections[self.database_alias]
                if conn.in_atomic_block:
                    # Learnt inside the caller's transaction: cached only once
                    # it commits (the key row may be this transaction's own
                    # write, and a rollback would free the key).
                    transaction.on_commit(
                        partial(self._remember_unique, unique_key, deadline, _copy_result(result)),
                        using=self.database_alias,
                    )
                elif conn.get_autocommit():  # the statement has committed
                    self._remember_unique(unique_key, deadline, _copy_result(result))
                # Manual transactions (set_autocommit(False)) give no hook to
                # learn of the commit: not cached.
        return result, inserted

    def _remember_unique(self, unique_key, deadline, result) -> None:
        if deadline <= time.monotonic():  # the commit came too late to be worth it
            return
        with self._finished_lock:
            assert self._unique is not None  # only called when the cache is on
            self._unique.set(unique_key, (deadline, result))

    def _cached_unique(self, unique_key):
        """A copy of the cached holder's result, or None (not cached, or past its deadline)."""
        if self._unique is None:
            return None
        with self._finished_lock:
            entry = self._unique.get(unique_key)
            if entry is None:
                return None
            deadline, result = entry
            if deadline <= time.monotonic():
                self._unique.pop(unique_key)
                return None
        return _copy_result(result)

    def enqueue_many(self, task, calls) -> list[TaskResult]:
        """Enqueue many calls of one task: ids from the sequence, one COPY and one
        NOTIFY per distinct shard, in one atomic block (see shardq.enqueue_many)."""
        params = self._validate_once(task)
        calls = [(tuple(args), dict(kwargs)) for args, kwargs in calls]
        if not calls:
            return []
        if isinstance(task, ShardTask) and task.after:
            # task.using(after=[...]): every call waits for the same parents.
            from .workflows import Workflow

            workflow = Workflow()
            for args, kwargs in calls:
                workflow.add(task, *args, after=list(task.after), on_parent_failure=task.on_parent_failure, **kwargs)
            return workflow.enqueue()
        if isinstance(task, ShardTask) and task.unique_for is not None:
            return self._enqueue_many_unique(task, calls)
        rows = [self.job_row(task, args, kwargs) for args, kwargs in calls]
        run_after = params["run_after"]
        new_result = self._new_result
        results = []

        def on_job(index: int, job_id: int, enqueued_at) -> None:
            # Built while the server takes in the rows; an error here rolls
            # the COPY back with the rest.
            args, kwargs = calls[index]
            results.append(new_result(task, job_id, enqueued_at, run_after, args, kwargs))

        enqueue_statements.copy_jobs(
            self.database_alias,
            params,
            rows,
            notify=self.config.notify,
            channel=self.config.channel,
            on_job=on_job,
        )
        for result in results:
            if self._enqueued_gate.needed(logging.DEBUG):
                task_enqueued.send(type(self), task_result=result)
        return results

    def enqueue_graph(self, steps, workflow: str | None = None) -> list[TaskResult]:
        """Enqueue a workflow's steps (``shardq.workflows.Step``) in one atomic
        block: existing parents marked (``link_parents``; a missing one raises
        WorkflowError and stores nothing), ids reserved, the jobs and their
        edges COPYed, the shards of the jobs that can run at once NOTIFYed."""
        from .workflows import WorkflowError

        nodes = []
        for step in steps:
            task = step.task
            params = self._validate_once(task)
            if isinstance(task, ShardTask) and task.unique_for is not None:
                raise WorkflowError(
                    f"step {step.name!r}: {task.module_path} is a unique task (unique_for), which a "
                    "workflow cannot hold yet (a duplicate would stand for an existing job); enqueue it "
                    "on its own and give its TaskResult in after=."
                )
            params.update(self.job_row(task, step.args, step.kwargs))
            nodes.append(params)
        edges = []
        for step in steps:
            node = nodes[step.index]
            node["waiting"] = len(step.parents) + len(step.external)
            node.setdefault("has_children", False)
            for parent in step.parents:
                nodes[parent.index]["has_children"] = True
                edges.append((parent.index, step.index, parent.name, step.run_on_failure))
            # An existing parent: its id, negated (shardq/db/enqueue.py names it).
            edges.extend((-job_id, step.index, "", step.run_on_failure) for job_id in step.external)
        external = sorted({i for step in steps for i in step.external})

        def name_external(found: dict[int, str]) -> dict[int, str]:
            """Each existing parent's name in parent_results: its task's name
            (with [2], [3]... for repeats); refuses an id that does not exist."""
            missing = [i for i in external if i not in found]
            if missing:
                raise WorkflowError(
                    f"after names job(s) {', '.join(map(str, missing))}, which do not exist (never "
                    "enqueued, pruned or discarded): nothing was enqueued."
                )
            names: dict[int, str] = {}
            taken: set[str] = set()
            for job_id in external:
                base = name = found[job_id].rsplit(".", 1)[-1]
                n = 1
                while name in taken:
                    n += 1
                    name = f"{base}[{n}]"
                taken.add(name)
                names[job_id] = name
            return names

        ids, enqueued_at = enqueue_statements.copy_graph(
            self.database_alias,
            nodes,
            edges,
            external,
            workflow=workflow,
            notify=self.config.notify,
            channel=self.config.channel,
            name_external=name_external,
        )
        results = [
            self._new_result(step.task, job_id, enqueued_at, row["run_after"], step.args, step.kwargs)
            for job_id, step, row in zip(ids, steps, nodes, strict=True)
        ]
        if self._enqueued_gate.needed(logging.DEBUG):
            for result in results:
                task_enqueued.send(type(self), task_result=result)
        return results

    def _enqueue_many_unique(self, task, calls) -> list[TaskResult]:
        """enqueue_many of a unique task: every call validated first, then the
        unique path once per distinct key in one atomic block; a call whose
        key an earlier call of the batch had gets a copy of that result."""
        base = self.task_params(task)
        prepared = []
        for args, kwargs in calls:
            params = {**base, **self.job_row(task, args, kwargs)}
            prepared.append((args, kwargs, params, compute_unique_key(task, args, kwargs)))
        results = []
        inserted_results = []
        by_key: dict[str, TaskResult] = {}
        with transaction.atomic(using=self.database_alias):
            for args, kwargs, params, unique_key in prepared:
                first = by_key.get(unique_key)
                if first is not None:
                    results.append(_copy_result(first))
                    continue
                result = self._cached_unique(unique_key)
                if result is None:
                    result, inserted = self._insert_unique(task, args, kwargs, params, unique_key)
                    if inserted:
                        inserted_results.append(result)
                by_key[unique_key] = result
                results.append(result)
        for result in inserted_results:
            if self._enqueued_gate.needed(logging.DEBUG):
                task_enqueued.send(type(self), task_result=result)
        return results

    def _new_result(self, task, job_id, enqueued_at, run_after, args, kwargs):
        if not _FAST_RESULTS:
            return TaskResult(
                task=task,
                id=str(job_id),
                status=TaskResultStatus.READY,
                enqueued_at=enqueued_at,
                started_at=None,
                finished_at=None,
                last_attempted_at=None,
                args=list(args),
                kwargs=dict(kwargs),
                backend=self.alias,
                errors=[],
                worker_ids=[],
            )
        # The same object TaskResult(...) builds, field by field, without its
        # __init__ and __post_init__ (normalize_json of args and kwargs, done
        # here only when there is something to normalize), through the
        # frozen dataclass's slot descriptors: a quarter of the cost, and
        # enqueue_many builds one per job.
        result = _new_object(TaskResult)
        _set_task(result, task)
        _set_id(result, str(job_id))
        _set_status(result, TaskResultStatus.READY)
        _set_enqueued_at(result, enqueued_at)
        _set_started_at(result, None)
        _set_finished_at(result, None)
        _set_last_attempted_at(result, None)
        _set_args(result, normalize_json(list(args)) if args else [])
        _set_kwargs(result, normalize_json(dict(kwargs)) if kwargs else {})
        _set_backend(result, self.alias)
        _set_errors(result, [])
        _set_worker_ids(result, [])
        _set_return_value(result, None)
        return result

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
        if metrics.active is not None:
            metrics.active.count_cancelled({"queue_name": queue, "task_path": path} for _, queue, path in rows)
        return [str(job_id) for job_id in sorted(row[0] for row in rows)]

    def result_from_row(self, row) -> TaskResult:
        """The TaskResult of a ``get_job`` row (a dict by column name). Rows written by hand (raw SQL)
        may hold what shardq never writes; they are shown, never a 500: an
        unknown status reads as FAILED with an UnreadableJob error, a value of
        the wrong JSON shape as empty, an impossible time as None (see get_job)."""
        job_id, task_path, queue_name, priority = row["id"], row["task_path"], row["queue_name"], row["priority"]
        run_after, status, args, kwargs = row["run_after"], row["status"], row["args"], row["kwargs"]
        return_value, errors, worker_ids = row["return_value"], row["errors"], row["worker_ids"]
        enqueued_at, started_at, finished_at = row["enqueued_at"], row["started_at"], row["finished_at"]
        last_attempted_at = row["last_attempted_at"]
        task = resolve(task_path, self.config.task_modules)
        # run_after defaults to the enqueue time in the table; a Task shows it
        # only when the job was deferred.
        if run_after is not None and (enqueued_at is None or run_after <= enqueued_at):
            run_after = None
        if (task.priority, task.queue_name, task.run_after) != (priority, queue_name, run_after):
            try:
                task = task.using(priority=priority, queue_name=queue_name, run_after=run_after)
            except InvalidTask:  # a stored priority or queue this task could not be given
                pass
        task_errors = [_task_error(e) for e in _json_list(errors)]
        if status in ("CLAIMED", "WAITING"):
            # In a worker's buffer, or waiting for a workflow's parents: not
            # started, READY to Django (which has no such status).
            status = TaskResultStatus.READY
        elif status not in _STATUSES:
            task_errors.append(
                TaskError(
                    exception_class_path="shardq.exceptions.UnreadableJob",
                    traceback=f"shardq.exceptions.UnreadableJob: job {job_id} has the status "
                    f"{status!r}, which is not a shardq status.\n",
                )
            )
            status = TaskResultStatus.FAILED
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus(status),
            enqueued_at=enqueued_at,
            started_at=started_at,
            finished_at=finished_at,
            last_attempted_at=last_attempted_at,
            args=_json_list(args),
            kwargs=_json_dict(kwargs),
            backend=self.alias,
            errors=task_errors,
            worker_ids=[w if isinstance(w, str) else json.dumps(w) for w in _json_list(worker_ids)],
        )
        object.__setattr__(result, "_return_value", load_json(return_value))
        return result


_STATUSES = frozenset(TaskResultStatus.values)


def _json_list(value) -> list:
    value = load_json(value)
    return value if isinstance(value, list) else []


def _json_dict(value) -> dict:
    value = load_json(value)
    return value if isinstance(value, dict) else {}


def _task_error(entry) -> TaskError:
    """One stored error as a TaskError; an entry of another shape is shown as
    an UnreadableJob error holding its JSON."""
    if (
        isinstance(entry, dict)
        and isinstance(entry.get("exception_class_path"), str)
        and isinstance(entry.get("traceback"), str)
    ):
        return TaskError(exception_class_path=entry["exception_class_path"], traceback=entry["traceback"])
    return TaskError(
        exception_class_path="shardq.exceptions.UnreadableJob",
        traceback=f"shardq.exceptions.UnreadableJob: an error entry of an unknown shape: {json.dumps(entry)[:1000]}\n",
    )


def check_run_after(task) -> None:
    """Refuse a run_after that is not a datetime with a message that says
    what to pass (Django's own check calls ``utcoffset`` on it: an
    AttributeError for a timedelta, a string or a number)."""
    run_after = task.run_after
    if run_after is None or isinstance(run_after, datetime):
        return
    hint = ""
    if isinstance(run_after, timedelta):
        hint = " A delay is timezone.now() + the timedelta (a @shard_task's .using() also takes the timedelta itself)."
    raise InvalidTask(
        f"{task.module_path}: run_after must be an aware datetime, e.g. "
        f".using(run_after=timezone.now() + timedelta(minutes=5)), not {type(run_after).__name__} "
        f"{_short_repr(run_after)}.{hint}"
    )


def validate_stored_names(task) -> None:
    """Refuse a task whose queue name or path the job table cannot hold
    (raises InvalidTask): checked when the Task is built (``@task``,
    ``.using(queue_name=...)``), so enqueue never meets a DataError."""
    queue_name = task.queue_name
    if not isinstance(queue_name, str) or not queue_name:
        raise InvalidTask(f"{task.module_path}: queue_name must be a non-empty str, not {queue_name!r}.")
    check_text(queue_name, f"{task.module_path}: queue_name")
    if len(queue_name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidTask(
            f"{task.module_path}: queue_name is {len(queue_name)} characters, over the "
            f"{MAX_QUEUE_NAME_LENGTH} that shardq_job.queue_name holds. Use a shorter queue name."
        )
    if len(task.module_path) > MAX_TASK_PATH_LENGTH:
        raise InvalidTask(
            f"The task path {task.module_path[:80]}... is {len(task.module_path)} characters, over "
            f"the {MAX_TASK_PATH_LENGTH} that shardq_job.task_path holds. Use a shorter module or "
            "function name."
        )


def unique_cache_size(options) -> int:
    """``OPTIONS["UNIQUE_CACHE_SIZE"]``, or the default when it is not an int >= 0
    (the check shardq.E007 reports that)."""
    size = options.get("UNIQUE_CACHE_SIZE", UNIQUE_KEYS_CACHED)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        return size
    return UNIQUE_KEYS_CACHED


# _new_result fills a TaskResult's fields itself only while they are the ones
# it knows (a Django upgrade that changes them falls back to the constructor).
_FAST_RESULTS = tuple(f.name for f in dataclass_fields(TaskResult)) == (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)
_RESULT_FIELDS = tuple(f.name for f in dataclass_fields(TaskResult))
_new_object = object.__new__
_set = object.__setattr__
if _FAST_RESULTS:
    (
        _set_task,
        _set_id,
        _set_status,
        _set_enqueued_at,
        _set_started_at,
        _set_finished_at,
        _set_last_attempted_at,
        _set_args,
        _set_kwargs,
        _set_backend,
        _set_errors,
        _set_worker_ids,
        _set_return_value,
    ) = (vars(TaskResult)[name].__set__ for name in _RESULT_FIELDS)


def _json_or_none(value: object) -> str | None:
    return None if value is None else json.dumps(value)


# A job id is the canonical decimal string of a positive bigint: int() alone
# would also accept " 7", "0007" and "0_7", so one job would answer to many ids.
_JOB_ID = re.compile(r"[1-9][0-9]{0,18}")
_MAX_BIGINT = 2**63 - 1


def parse_job_id(result_id) -> int | None:
    """The job id a result id names, or None when it cannot name a job."""
    if not isinstance(result_id, str) or not _JOB_ID.fullmatch(result_id):
        return None
    job_id = int(result_id)
    return job_id if job_id <= _MAX_BIGINT else None


def _copy_result(result: TaskResult) -> TaskResult:
    """A copy a caller may mutate (refresh(), its lists) without touching the cache."""
    if _FAST_RESULTS:
        # Field by field: a quarter of copy.copy's cost (its __reduce_ex__
        # round trip), and a duplicate answered from the cache is one copy.
        copied = _new_object(TaskResult)
        for name in _RESULT_FIELDS:
            _set(copied, name, getattr(result, name))
    else:
        copied = copy.copy(result)
    _set(copied, "args", list(result.args))
    _set(copied, "kwargs", dict(result.kwargs))
    _set(copied, "errors", list(result.errors))
    _set(copied, "worker_ids", list(result.worker_ids))
    return copied


def load_json(value):
    # Django's cursor hands jsonb back as text; psycopg's own as Python values.
    return json.loads(value) if isinstance(value, str) else value


def _dumps(value) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


# Containers (lists, dicts) nested deeper than this in one argument are
# refused at enqueue: json.dumps and PostgreSQL's jsonb parser recurse, and a
# 5,000-deep value from a request body would end in a RecursionError or a
# "stack depth limit exceeded" DataError.
MAX_ARGUMENT_DEPTH = 100
# Columns of shardq_job (shardq/models.py) a task's definition fills.
MAX_QUEUE_NAME_LENGTH = 100
MAX_TASK_PATH_LENGTH = 300


def dump_arguments(task, args, kwargs) -> str:
    """The positional arguments as JSON text (raises InvalidTask naming the bad one)."""
    if not args:
        return "[]"

    def named():
        return [(f"positional argument {position}", value) for position, value in enumerate(args)]

    try:
        text = _dumps(list(args))
    except (TypeError, ValueError, RecursionError):
        _find_bad_argument(task, named)
        raise
    _check_dumped(task, text, named)
    return text


def dump_keyword_arguments(task, kwargs) -> str:
    """The keyword arguments as JSON text (raises InvalidTask naming the bad one)."""
    if not kwargs:
        return "{}"

    def named():
        return [(f"keyword argument {name!r}", value) for name, value in kwargs.items()]

    try:
        text = _dumps(kwargs)
    except (TypeError, ValueError, RecursionError):
        _find_bad_argument(task, named)
        raise
    if "\\u0000" in text or "\\ud" in text:
        for name in kwargs:  # **{"a\x00": 1} is a valid Python call
            check_text(name, f"{task.module_path}: the name of keyword argument {name!r}")
    _check_dumped(task, text, named)
    return text


def _check_dumped(task, text, named) -> None:
    """Cheap tests on the JSON text json.dumps made: it escapes every NUL as
    \\u0000 and every surrogate as \\udXXX, and a value cannot nest deeper
    than its brackets. Only a hit walks the arguments to name the bad one (a
    hit may be a false alarm: a literal backslash, a valid surrogate pair, a
    wide but shallow value)."""
    strings = "\\u0000" in text or "\\ud" in text
    # A dict inside an argument (keyword arguments are one dict themselves):
    # json.dumps writes a key 1, 1.5, True or None as a string, and the task
    # would get {"1": ...} for {1: ...}, so such keys are refused.
    dicts = text.find("{", 1 if text.startswith("{") else 0) != -1
    if strings or dicts or text.count("[") + text.count("{") > MAX_ARGUMENT_DEPTH:
        for what, value in named():
            _check_value(task, what, value, strings=strings, keys=dicts)


def _find_bad_argument(task, named) -> None:
    """Raise InvalidTask for the first bad argument among the (name, value)
    pairs ``named()`` returns (json.dumps refused them); return when none is bad."""
    pairs = named()
    for what, value in pairs:
        _check_value(task, what, value)
    for what, value in pairs:
        _check_json(task, what, value)


_CONTAINERS = (list, tuple, dict)


def _check_value(task, what, value, *, strings=True, keys=True) -> None:
    """Walk one argument without recursion: refuse nesting deeper than
    MAX_ARGUMENT_DEPTH, (``strings``) str values or dict keys, at any
    depth, that PostgreSQL cannot store, and (``keys``) dict keys that are
    not strings (JSON would turn them into strings). Other types are left to
    json.dumps (``_check_json``)."""
    if isinstance(value, str):
        if strings:
            _check_string(task, what, value)
        return
    if not isinstance(value, _CONTAINERS):
        return
    # (container, its depth, its path as a (parent path, step) chain)
    stack: list[tuple[list | tuple | dict, int, tuple | None]] = [(value, 1, None)]
    pop, push = stack.pop, stack.append
    while stack:
        container, depth, path = pop()
        if depth > MAX_ARGUMENT_DEPTH:
            raise InvalidTask(
                f"{task.module_path}: {what} is nested more than {MAX_ARGUMENT_DEPTH} lists or "
                f"dicts deep (at {_path_text(path)}). Pass a flatter value, or store the data "
                "elsewhere (a model, a file) and pass its id."
            )
        if keys and isinstance(container, dict):
            _check_keys(task, what, container, path)
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for step, item in items:
            if strings:
                if isinstance(step, str) and ("\x00" in step or not step.isascii()):
                    _check_string(task, what, step, path, key=True)
                if isinstance(item, str):
                    if "\x00" in item or not item.isascii():
                        _check_string(task, what, item, (path, step))
                    continue
            if isinstance(item, _CONTAINERS):
                push((item, depth + 1, (path, step)))


def _check_keys(task, what, mapping: dict, path) -> None:
    for key in mapping:
        if not isinstance(key, str):
            where = what if path is None else f"{what} at {_path_text(path)}"
            try:
                becomes = f"so the task would get the key {json.dumps({key: 0})[1:-4]} instead"
            except TypeError:
                becomes = "and json cannot write this one at all"
            raise ArgumentNotJSON(
                f"{task.module_path}: {where} has the dict key {key!r} ({type(key).__name__}): JSON object "
                f"keys are strings, {becomes}. Use string keys (str(key)), or pass a list of pairs."
            )


def _check_string(task, what, text, path=None, key=False) -> None:
    if "\x00" not in text and text.isascii():
        return
    where = what
    if path is not None:
        where = f"{what} at {_path_text(path)}"
    if key:
        where = f"a dict key in {where}"
    check_text(text, f"{task.module_path}: {where}")


def _path_text(path) -> str:
    """``path`` (a (parent, step) chain) as Python subscripts: ``['rows'][3]``."""
    steps = []
    while path is not None:
        path, step = path
        steps.append(f"[{step!r}]")
    return "".join(reversed(steps)) or "the top level"


def _check_json(task, what, value) -> None:
    try:
        _dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ArgumentNotJSON(
            f"{task.module_path}: {what} is not JSON ({type(value).__name__}: {exc}). "
            "shardq stores arguments as JSON and never pickles: pass ids, strings, numbers, "
            "lists or dicts."
        ) from exc
