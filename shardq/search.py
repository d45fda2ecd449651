"""Finding jobs by task, keyword-argument values, tags, status and queue
(``shardq.jobs``; the admin's ``customer_id=7`` search; docs/admin.md,
"Tags and search").

Every filter here is answered through an index of ``shardq_job``:
``where`` through ``shardq_job_kwargs_idx`` (GIN jsonb_path_ops on kwargs:
``kwargs @> '{"customer_id": 7}'``) and, for the few jobs in flight, which
that index leaves out, ``shardq_job_inflight_idx`` (argument_filter);
``tags`` through ``shardq_job_tags_idx`` (``tags @> '["billing"]'``), newest
first through the primary key.
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import BigIntegerField, BooleanField, F, Func, Model, Q, QuerySet
from django.tasks import Task

from .core.tags import normalize_tags

#: The statuses a job may be in (shardq.models.JOB_STATUSES' values).
STATUSES = ("READY", "CLAIMED", "RUNNING", "WAITING", "SUSPENDED", "SUCCESSFUL", "FAILED")

# The admin's search syntax: ``name=value``, ``kwargs.name=value`` or
# ``args.name=value`` (the spelling; both search keyword arguments).
ARGUMENT_SEARCH = re.compile(r"^\s*(?:(?:kwargs|args)\.)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$", re.DOTALL)


def jobs(
    task: Task | str | None = None,
    *,
    where: Mapping[str, Any] | None = None,
    tags: Iterable[str] | None = None,
    status: str | Iterable[str] | None = None,
    queue: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> QuerySet:
    """The jobs matching every filter given, newest first, as a lazy
    ``QuerySet`` of ``shardq.models.Job`` rows (slice it: ``[:100]``).

    - ``task``: a task (or its module path, ``"billing.tasks.charge"``).
    - ``where``: keyword-argument values the job was enqueued with, matched
      as JSON containment (``{"customer_id": 7}`` matches a job enqueued
      with ``customer_id=7`` and any other arguments; 7 is not "7"; a nested
      dict matches part of a nested value). Only keyword arguments are
      searched: a value passed by position is not found.
    - ``tags``: jobs carrying every one of these tags.
    - ``status``: one status or several (``"FAILED"``, ``["READY", "RUNNING"]``).
    - ``queue``: a queue name.

    Bad filters raise ``ValueError`` naming what is wrong. A job's
    ``TaskResult`` is ``task.get_result(str(job.id))``.
    """
    from .models import Job

    queryset = Job.objects.using(using).all()
    if task is not None:
        if isinstance(task, Task):
            path = task.module_path
        elif isinstance(task, str) and task:
            path = task
        else:
            raise ValueError(f"task must be a task or its module path (a string), not {task!r}.")
        queryset = queryset.filter(task_path=path)
    if where is not None:
        checked_where = check_where(where, task if isinstance(task, Task) else None)
        queryset = queryset.filter(argument_filter([checked_where], Job))
    if tags is not None:
        checked = normalize_tags(tags, "shardq.jobs(tags=...)")
        if checked:
            queryset = queryset.filter(tags_filter(checked))
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown or not statuses:
            raise ValueError(
                f"status {unknown[0] if unknown else status!r} is not a job status: one of {', '.join(STATUSES)}."
            )
        queryset = queryset.filter(status__in=statuses)
    if queue is not None:
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"queue must be a queue name, not {queue!r}.")
        queryset = queryset.filter(queue_name=queue)
    return queryset.order_by("-id")


def check_where(where: Any, task: Task | None = None) -> dict[str, Any]:
    """``where`` as a JSON object of keyword-argument values (ValueError
    otherwise); with ``task``, each name must be one of its arguments."""
    if not isinstance(where, Mapping) or not where:
        raise ValueError(
            f"where must be a non-empty dict of keyword-argument values (e.g. where={{'customer_id': 7}}), not {where!r}."
        )
    for name in where:
        if not isinstance(name, str) or not name:
            raise ValueError(f"where: {name!r} is not an argument name (a non-empty string).")
    try:
        value = json.loads(json.dumps(dict(where), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"where: the values must be JSON (numbers, strings, lists, dicts, true/false/null): {exc}"
        ) from None
    if task is not None:
        from .tasks.keys import signature_of

        params = signature_of(task).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            missing = [name for name in value if name not in params]
            if missing:
                raise ValueError(
                    f"where: {missing[0]!r} is not an argument of {task.module_path} "
                    f"(its arguments: {', '.join(params) or 'none'}); no job of it could match."
                )
    return value


class _IdAmong(Func):
    """``<id> = ANY(ARRAY(<subquery>))``: the subquery (a named block) runs first,
    once, as an InitPlan, and the row's id is then an index condition of the
    primary key. Written so the planner cannot walk the primary key newest
    first filtering every row by the subquery's terms, which it may choose
    for ``id IN (subquery)`` or for an OR of the terms when it overestimates
    how many rows match (docs/benchmarks.md, "Search index cost": 8.8 s at
    ten million rows instead of 66 ms)."""

    output_field = BooleanField()
    conditional = True

    def as_sql(self, compiler, connection, **extra_context):
        column, column_params = compiler.compile(self.source_expressions[0])
        subquery, subquery_params = compiler.compile(self.source_expressions[1])  # "(SELECT ...)"
        return f"{column} = ANY(ARRAY{subquery})", (*column_params, *subquery_params)


def argument_filter(wheres: Sequence[Mapping[str, Any]], model: type[Model]) -> Q:
    """Rows of ``model`` (Job or JobHistory) enqueued with any one of
    ``wheres``' keyword-argument values: ``kwargs @> where``.

    On shardq_job the index by keyword argument (shardq_job_kwargs_idx)
    leaves out the versions of jobs in flight (CLAIMED, RUNNING: a job's
    claim and start writes are then no entries of it), so the jobs in
    flight (what the workers hold in their buffers and threads: thousands
    at most, not the table) are read through shardq_job_inflight_idx and
    tested one by one (the named block ``argument_search_ids``); the
    matching ids of both come first (_IdAmong), and the row filters and
    order apply to them. The history's index holds every row: a plain
    ``@>``."""
    from .db import operations
    from .models import Job

    if not wheres:
        raise ValueError("argument_filter needs at least one where.")
    if model is not Job:
        match = Q()
        for where in wheres:
            match |= Q(kwargs__contains=dict(where))
        return match
    values = [json.dumps(dict(where)) for where in wheres]
    ids = operations.expression("argument_search_ids", {"wheres": values}, BigIntegerField())
    return Q(_IdAmong(F("id"), ids))


def tags_filter(tags: Iterable[str]) -> Q:
    """``tags @> [...]`` (every one of them): answered by shardq_job_tags_idx."""
    return Q(tags__contains=list(tags))


def parse_argument_search(term: str) -> tuple[str, list[Any]] | None:
    """The admin search ``customer_id=7`` (or ``args.customer_id=7``,
    ``kwargs.customer_id=7``) as (name, the JSON values it may mean), or
    None for a term of another kind. The value is JSON when it parses
    (``7``, ``true``, ``"7"``, ``{"a": 1}``); a bare value is matched both
    as it parses and as text, so ``7`` finds ``7`` and ``"7"``."""
    match = ARGUMENT_SEARCH.match(term)
    if match is None:
        return None
    name, text = match.group(1), match.group(2)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return name, [text]
    if text.startswith('"') or isinstance(value, str):
        return name, [value]
    values = [value]
    if not isinstance(value, (dict, list)):
        values.append(text)
    return name, values
