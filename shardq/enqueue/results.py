"""TaskResults: the READY one of a job just enqueued (built field by field
when Django's TaskResult has the fields this knows), a copy a caller may
change, and the one a ``get_job`` row reads as."""

import copy
import json
import re
from dataclasses import fields as dataclass_fields

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask
from django.utils.json import normalize_json

from ..exceptions import UnknownTask
from ..tasks.registry import placeholder, resolve

# new_result fills a TaskResult's fields itself only while they are the ones
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


def new_result(task, job_id, enqueued_at, run_after, args, kwargs, backend_alias: str) -> TaskResult:
    """The READY TaskResult of a job just enqueued."""
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
            backend=backend_alias,
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
    _set_backend(result, backend_alias)
    _set_errors(result, [])
    _set_worker_ids(result, [])
    _set_return_value(result, None)
    return result


def copy_result(result: TaskResult) -> TaskResult:
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


def result_from_row(row, backend_alias: str, task_modules) -> TaskResult:
    """The TaskResult of a ``get_job`` row (a dict by column name). Rows written by hand (raw SQL)
    may hold what shardq never writes; they are shown, never a 500: an
    unknown status reads as FAILED with an UnreadableJob error, a value of
    the wrong JSON shape as empty, an impossible time as None (see get_job)."""
    job_id, task_path, queue_name, priority = row["id"], row["task_path"], row["queue_name"], row["priority"]
    run_after, status, args, kwargs = row["run_after"], row["status"], row["args"], row["kwargs"]
    return_value, errors, worker_ids = row["return_value"], row["errors"], row["worker_ids"]
    enqueued_at, started_at, finished_at = row["enqueued_at"], row["started_at"], row["finished_at"]
    last_attempted_at = row["last_attempted_at"]
    try:
        task = resolve(task_path, task_modules)
    except UnknownTask:
        # A job of a task this process does not define (web code older than
        # the workers', a task since removed): its result is still shown,
        # on a placeholder whose module_path is the row's path.
        task = placeholder(task_path, backend_alias)
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
    elif status == "SUSPENDED":
        # A durable job asleep or waiting for a signal (shardq/durable.py):
        # it has started and not finished, RUNNING to Django.
        status = TaskResultStatus.RUNNING
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
        backend=backend_alias,
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
