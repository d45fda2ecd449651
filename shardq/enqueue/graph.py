"""Graphs of jobs (``shardq/workflows.py``, docs/workflows.md): a
workflow's steps enqueued in one atomic block, and ``task.using(after=[...])``,
a graph of one job per call waiting on jobs that exist."""

from collections.abc import Callable

from django.tasks import Task, TaskResult

from .. import tracing
from ..db import enqueue as enqueue_statements
from ..db import operations
from ..exceptions import WorkflowError
from ..tasks import ShardTask
from ..workflows import Workflow


def enqueue_after(task: ShardTask, calls: list[tuple[tuple, dict]]) -> list[TaskResult]:
    """``task.using(after=[...])``: each call a job WAITING on the same
    existing parents, enqueued as one workflow."""
    workflow = Workflow()
    for args, kwargs in calls:
        workflow.add(task, *args, after=list(task.after), on_parent_failure=task.on_parent_failure, **kwargs)
    return workflow.enqueue()


def enqueue_graph(
    steps,
    *,
    task_params: Callable[[Task], dict],
    job_row: Callable[[Task, tuple, dict], dict],
    new_result: Callable[..., TaskResult],
    database_alias: str,
    notify: bool,
    channel: str,
    workflow: str | None = None,
) -> list[TaskResult]:
    """Enqueue a workflow's steps (``shardq.workflows.Step``) in one atomic
    block: existing parents marked (``link_parents``; a missing one raises
    WorkflowError and stores nothing), ids reserved, the jobs and their
    edges COPYed, the shards of the jobs that can run at once NOTIFYed.
    ``task_params`` (a task's validated params, a copy) and ``job_row`` (a
    call's) are the backend's; returns a result per step."""
    nodes = []
    for step in steps:
        task = step.task
        params = task_params(task)
        if isinstance(task, ShardTask) and task.unique_for is not None:
            raise WorkflowError(
                f"step {step.name!r}: {task.module_path} is a unique task (unique_for), which a "
                "workflow cannot hold yet (a duplicate would stand for an existing job); enqueue it "
                "on its own and give its TaskResult in after=."
            )
        params.update(job_row(task, step.args, step.kwargs))
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

    spans = None
    if tracing.enabled:
        # A span per step, linked to its parents' (shardq/tracing.py); an
        # existing parent's through the traceparent stored with it.
        stored = {}
        if external:
            stored = dict(operations.run("job_traceparents", {"ids": external}, using=database_alias))
        spans = tracing.step_spans(steps, nodes, stored)
    try:
        ids, enqueued_at = enqueue_statements.copy_graph(
            database_alias,
            nodes,
            edges,
            external,
            workflow=workflow,
            notify=notify,
            channel=channel,
            name_external=name_external,
        )
    except BaseException as error:
        if spans is not None:
            tracing.end_step_spans(spans, None, error)
        raise
    if spans is not None:
        tracing.end_step_spans(spans, ids)
    return [
        new_result(step.task, job_id, enqueued_at, row["run_after"], step.args, step.kwargs)
        for job_id, step, row in zip(ids, steps, nodes, strict=True)
    ]
