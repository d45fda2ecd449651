"""shardq's Django Tasks backend: ``TASKS = {"default": {"BACKEND":
"shardq.backend.ShardqBackend", ...}}``.

``enqueue`` inserts the job on the caller's own database connection, so inside
``transaction.atomic()`` the job exists exactly when the caller commits.
Arguments and results are JSON, never pickles.
"""

import json
import random
import re

from django.db import DEFAULT_DB_ALIAS, connections
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from .checks import backend_checks
from .conf import get_config
from .core.hashing import shard_key_hash
from .db.queries import QUERIES
from .tasks import ShardTask, compute_shard_key, register, resolve, validate_shard_options


class ShardqBackend(BaseTaskBackend):
    task_class = ShardTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        self.database_alias = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        self.config = get_config()

    # -- definition time ----------------------------------------------------

    def validate_task(self, task):
        super().validate_task(task)
        validate_shard_options(task)
        register(task)

    def check(self, **kwargs):
        yield from backend_checks(self)

    # -- enqueue ------------------------------------------------------------

    def job_row(self, task, args, kwargs) -> dict:
        """Validate one call and build its row (raises InvalidTask, stores nothing)."""
        args_json = dump_arguments(task, args, kwargs)
        kwargs_json = dump_keyword_arguments(task, kwargs)
        size = len(args_json) + len(kwargs_json)
        if size > self.config.max_payload_bytes:
            raise InvalidTask(
                f"{task.module_path}: the arguments are {size} bytes of JSON, over "
                f"SHARDQ['MAX_PAYLOAD_BYTES'] = {self.config.max_payload_bytes}. Store large "
                "data elsewhere (a model, a file) and pass its id."
            )
        key = compute_shard_key(task, args, kwargs)
        key_hash = shard_key_hash(key) if key is not None else random.getrandbits(32) - 2**31
        return {
            "shard": key_hash & (self.config.shard_count - 1),
            "key_hash": key_hash,
            "shard_key": key,
            "args": args_json,
            "kwargs": kwargs_json,
        }

    def task_params(self, task) -> dict:
        is_shard_task = isinstance(task, ShardTask)
        return {
            "task_path": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": task.run_after,
            "ordered": is_shard_task and task.ordered,
            "max_attempts": task.max_attempts if is_shard_task else 1,
            "channel": self.config.channel,
        }

    def enqueue(self, task, args, kwargs):
        self.validate_task(task)
        params = self.task_params(task)
        params.update(self.job_row(task, args, kwargs))
        query = QUERIES["insert_job" if self.config.notify else "insert_job_quiet"]
        with connections[self.database_alias].cursor() as cursor:
            cursor.execute(query, params)
            job_id, enqueued_at, run_after, _ = cursor.fetchone()
        result = self._new_result(task, job_id, enqueued_at, run_after, args, kwargs)
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue_many(self, task, calls) -> list[TaskResult]:
        """Enqueue many calls of one task in one statement (see shardq.enqueue_many)."""
        self.validate_task(task)
        calls = [(tuple(args), dict(kwargs)) for args, kwargs in calls]
        if not calls:
            return []
        rows = [self.job_row(task, args, kwargs) for args, kwargs in calls]
        params = self.task_params(task)
        params.update(
            shards=[r["shard"] for r in rows],
            key_hashes=[r["key_hash"] for r in rows],
            shard_keys=[r["shard_key"] for r in rows],
            args=[r["args"] for r in rows],
            kwargs=[r["kwargs"] for r in rows],
            notify=self.config.notify,
        )
        with connections[self.database_alias].cursor() as cursor:
            cursor.execute(QUERIES["insert_jobs"], params)
            inserted = cursor.fetchall()
        results = [
            self._new_result(task, job_id, enqueued_at, run_after, args, kwargs)
            for (job_id, enqueued_at, run_after, _), (args, kwargs) in zip(inserted, calls, strict=True)
        ]
        for result in results:
            task_enqueued.send(type(self), task_result=result)
        return results

    def _new_result(self, task, job_id, enqueued_at, run_after, args, kwargs):
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

    # -- results ------------------------------------------------------------

    def get_result(self, result_id):
        job_id = parse_job_id(result_id)
        if job_id is None:
            raise TaskResultDoesNotExist(f"No shardq job has the id {result_id!r}.")
        with connections[self.database_alias].cursor() as cursor:
            cursor.execute(QUERIES["get_job"], {"id": job_id})
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(f"No shardq job has the id {result_id!r}.")
        return self.result_from_row(row)

    def result_from_row(self, row) -> TaskResult:
        (job_id, task_path, _backend, queue_name, priority, run_after, status, args, kwargs,
         return_value, errors, worker_ids, enqueued_at, started_at, finished_at,
         last_attempted_at, *_rest) = row
        task = resolve(task_path, self.config.task_modules)
        # run_after defaults to the enqueue time in the table; a Task shows it
        # only when the job was deferred.
        if run_after is not None and run_after <= row[12]:
            run_after = None
        if (task.priority, task.queue_name, task.run_after) != (priority, queue_name, run_after):
            task = task.using(priority=priority, queue_name=queue_name, run_after=run_after)
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus(status),
            enqueued_at=enqueued_at,
            started_at=started_at,
            finished_at=finished_at,
            last_attempted_at=last_attempted_at,
            args=load_json(args),
            kwargs=load_json(kwargs),
            backend=self.alias,
            errors=[TaskError(**e) for e in load_json(errors)],
            worker_ids=list(load_json(worker_ids)),
        )
        object.__setattr__(result, "_return_value", load_json(return_value))
        return result


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


def load_json(value):
    # Django's cursor hands jsonb back as text; psycopg's own as Python values.
    return json.loads(value) if isinstance(value, str) else value


def _dumps(value) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def dump_arguments(task, args, kwargs) -> str:
    try:
        text = _dumps(list(args))
    except (TypeError, ValueError):
        for position, value in enumerate(args):
            _check_json(task, f"positional argument {position}", value)
        raise
    if "\\u0000" in text:
        raise InvalidTask(f"{task.module_path}: a positional argument holds a NUL character, which PostgreSQL's jsonb cannot store.")
    return text


def dump_keyword_arguments(task, kwargs) -> str:
    try:
        text = _dumps(kwargs)
    except (TypeError, ValueError):
        for name, value in kwargs.items():
            _check_json(task, f"keyword argument {name!r}", value)
        raise
    if "\\u0000" in text:
        raise InvalidTask(f"{task.module_path}: a keyword argument holds a NUL character, which PostgreSQL's jsonb cannot store.")
    return text


def _check_json(task, what, value) -> None:
    try:
        _dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidTask(
            f"{task.module_path}: {what} is not JSON ({type(value).__name__}: {exc}). "
            "shardq stores arguments as JSON and never pickles: pass ids, strings, numbers, "
            "lists or dicts."
        ) from exc
