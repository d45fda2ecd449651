"""Workflows: jobs that wait for other jobs, enqueued as one graph.

```python
with transaction.atomic():
    wf = Workflow(name="order-7")
    charge = wf.add(charge_card, order_id=7)
    pack = wf.add(pack_items, order_id=7, after=[charge])
    done = wf.add(close_order, order_id=7, after=[pack], on_parent_failure="run")
    results = wf.enqueue()  # all inserted or none
```

State model of a job with parents (docs/workflows.md):

    WAITING ──last parent resolved, every one SUCCESSFUL (or "run")──▶ READY (NOTIFY)
    WAITING ──a parent resolved FAILED, on_parent_failure="cancel"──▶ FAILED (ParentFailed)
    FAILED (ParentFailed) ──admin Retry of that parent──▶ WAITING

A WAITING job is in no index the claim walks. The outcome write is not
changed: a parent whose children have not been moved on carries
``children_pending``, and once its status is SUCCESSFUL or FAILED (however it
got there: an ack, a transactional completion, a cancel, a rescue's
WorkerLost) it is in ``shardq_job_resolve_idx``; the resolver of the worker
holding its shard (``shardq/worker/resolver.py``) moves its children on in one
statement (``resolve_children``). A graph built with ``add`` has no cycle:
a step can only wait for steps added before it, or for jobs that exist.
"""

from collections.abc import Iterable
from typing import Any

from django.tasks import Task, TaskResult

from .exceptions import WorkflowError

ON_PARENT_FAILURE = ("cancel", "run")


def check_on_parent_failure(value: Any) -> str:
    if value not in ON_PARENT_FAILURE:
        raise WorkflowError(
            f"on_parent_failure must be 'cancel' (the default: the job ends FAILED with ParentFailed) "
            f"or 'run' (it runs and reads the failure in context.parent_results), not {value!r}."
        )
    return str(value)


def parent_ids(after: Any, where: str) -> list[int]:
    """The job ids of ``after`` (TaskResults or their ids), checked."""
    if isinstance(after, (str, bytes, TaskResult, int)) or not isinstance(after, Iterable):
        raise WorkflowError(f"{where}: after must be a list of TaskResults or job ids, not {after!r}.")
    ids = []
    for item in after:
        text = item.id if isinstance(item, TaskResult) else item
        if isinstance(text, int) and not isinstance(text, bool):
            text = str(text)
        if not isinstance(text, str) or not text.isdigit() or text != str(int(text)) or int(text) >= 2**63:
            raise WorkflowError(
                f"{where}: {item!r} is not a job id (give the TaskResult of an enqueued job, or its id)."
            )
        ids.append(int(text))
    return ids


class Step:
    """A job of a workflow before it is enqueued; what ``Workflow.add`` returns.

    ``name`` is its key in its children's ``context.parent_results``;
    ``result`` is its ``TaskResult`` once the workflow is enqueued."""

    __slots__ = ("workflow", "index", "task", "args", "kwargs", "name", "parents", "external", "run_on_failure")

    def __init__(self, workflow, index, task, args, kwargs, name, parents, external, run_on_failure):
        self.workflow = workflow
        self.index = index
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.name = name
        self.parents: list[Step] = parents
        self.external: list[int] = external
        self.run_on_failure: bool = run_on_failure

    @property
    def result(self) -> TaskResult:
        results = self.workflow.results
        if results is None:
            raise WorkflowError(f"step {self.name!r} has no result yet: call enqueue() on its workflow first.")
        return results[self.index]

    def __repr__(self):
        return f"<Step {self.name!r} of workflow {self.workflow.name!r}>"


class Workflow:
    """A graph of jobs enqueued together: all of them, or none."""

    def __init__(self, name: str | None = None):
        if name is not None and (not isinstance(name, str) or "\x00" in name or len(name) > 200):
            raise WorkflowError(f"a workflow's name must be text of at most 200 characters, not {name!r}.")
        self.name = name
        self.steps: list[Step] = []
        self._names: set[str] = set()
        self._repeats: dict[str, int] = {}
        self.results: list[TaskResult] | None = None

    def add(
        self,
        task: Task,
        /,
        *args: Any,
        after: Iterable[Any] = (),
        on_parent_failure: str = "cancel",
        step_name: str | None = None,
        **kwargs: Any,
    ) -> Step:
        """Add a call of ``task``; it waits for every step or job in ``after``.

        ``after`` holds steps of this workflow added before (so no cycle can
        form) or ``TaskResult``s / ids of jobs already enqueued.
        ``step_name`` is the key of this step's result in its children's
        ``context.parent_results`` (default: the task's name, with ``[2]``,
        ``[3]``... when the workflow has it already)."""
        if self.results is not None:
            raise WorkflowError(f"workflow {self.name!r} is enqueued already: build a new Workflow.")
        if not isinstance(task, Task):
            raise WorkflowError(f"Workflow.add needs a task (a @task or @shard_task function), not {task!r}.")
        run_on_failure = check_on_parent_failure(on_parent_failure) == "run"
        parents: list[Step] = []
        seen: set[int] = set()
        external_items = []
        if isinstance(after, (str, bytes, Step, TaskResult)) or not isinstance(after, Iterable):
            raise WorkflowError(f"after must be a list of steps, TaskResults or job ids, not {after!r}.")
        for item in after:
            if isinstance(item, Step):
                if item.workflow is not self:
                    raise WorkflowError(
                        f"{item!r} belongs to another workflow: a step can only wait for steps of its own "
                        "workflow (or for jobs already enqueued, by their TaskResult)."
                    )
                if item.index in seen:
                    raise WorkflowError(f"{item!r} is named twice in after.")
                seen.add(item.index)
                parents.append(item)
            else:
                external_items.append(item)
        external = parent_ids(external_items, f"Workflow.add({task.name})") if external_items else []
        if len(set(external)) != len(external):
            raise WorkflowError(f"Workflow.add({task.name}): a job is named twice in after.")
        # A step waits only for steps that exist already, so the graph stays
        # acyclic; checked again here so no future way of adding edges breaks it.
        if any(p.index >= len(self.steps) for p in parents):
            raise WorkflowError("a step can only wait for steps added before it (a cycle would never run).")
        if step_name is None:
            # The next free "name[n]" (counted per name: a fan-out of
            # thousands of one task must not search from 2 each time).
            step_name, n = task.name, self._repeats.get(task.name, 1)
            while step_name in self._names:
                n += 1
                step_name = f"{task.name}[{n}]"
            self._repeats[task.name] = n
        elif not isinstance(step_name, str) or not step_name or "\x00" in step_name:
            raise WorkflowError(f"step_name must be non-empty text, not {step_name!r}.")
        elif step_name in self._names:
            raise WorkflowError(f"workflow {self.name!r} has a step named {step_name!r} already.")
        self._names.add(step_name)
        step = Step(self, len(self.steps), task, args, kwargs, step_name, parents, external, run_on_failure)
        self.steps.append(step)
        return step

    def enqueue(self) -> list[TaskResult]:
        """Insert every step's job in one transaction (the caller's, inside
        ``transaction.atomic()``); returns their ``TaskResult``s in the order
        the steps were added. A step with parents is WAITING (Django's API
        shows it READY) until they have finished."""
        if self.results is not None:
            raise WorkflowError(f"workflow {self.name!r} is enqueued already.")
        if not self.steps:
            return []
        backend = self.steps[0].task.get_backend()
        for step in self.steps:
            if step.task.backend != self.steps[0].task.backend:
                raise WorkflowError(
                    f"step {step.name!r} uses backend {step.task.backend!r}, step {self.steps[0].name!r} "
                    f"{self.steps[0].task.backend!r}: a workflow's jobs are enqueued in one transaction, "
                    "so they must share one backend."
                )
        if not hasattr(backend, "enqueue_graph"):
            raise WorkflowError(
                f"backend {self.steps[0].task.backend!r} ({type(backend).__name__}) is not shardq's: "
                "workflows need shardq.backend.ShardqBackend."
            )
        self.results = backend.enqueue_graph(self.steps, workflow=self.name)
        return self.results
