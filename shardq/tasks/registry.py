"""The task registry: a worker (and the backend's ``get_result``) resolves
the task paths rows name through it only. It holds the tasks this process
defined: the decorator registers each one (``validate_task``), and the
modules the settings name -- every installed app's ``tasks`` module and
``SHARDQ["TASK_MODULES"]`` -- are imported once, by configuration. A row's
task path is never imported: a row must not make a process run whatever
module of an installed app it names before it is refused."""

import threading
from dataclasses import dataclass
from importlib import import_module

from django.tasks import Task

from ..exceptions import UnknownTask

# Tasks register themselves when they are defined (validate_task runs in
# Task.__post_init__); task paths are resolved here only.
_registry: dict[str, Task] = {}
# The configured module sets imported so far (autodiscover), each once.
_discovered: set[tuple] = set()
_discovering = threading.Lock()


def register(task: Task) -> None:
    _registry.setdefault(task.module_path, task)


def registered_task_paths() -> list[str]:
    """The task paths defined (imported) in this process so far."""
    return list(_registry)


def is_registered(task_path: str) -> bool:
    """Whether ``task_path`` is a task defined (imported) in this process so
    far (the admin asks for each row: no copy of the registry)."""
    return task_path in _registry


def resolve(task_path: str, extra_modules: tuple = ()) -> Task:
    """The Task a job's ``task_path`` names, from the registry: the tasks
    defined in this process, the configured modules imported once first.
    Raises UnknownTask for any other path; nothing it names is imported."""
    task = _registry.get(task_path)
    if task is not None:
        return task
    discover(tuple(extra_modules))
    task = _registry.get(task_path)
    if task is not None:
        return task
    raise UnknownTask(
        f"No task {task_path!r} is defined in this process: a task is found in the installed apps' "
        "tasks modules and SHARDQ['TASK_MODULES'] only (a row's task path is never imported). Define "
        "it there, or list its module in SHARDQ['TASK_MODULES'], and deploy that code to the workers."
    )


def discover(extra_modules: tuple = ()) -> None:
    """``autodiscover`` once per set of extra modules (later calls return at once)."""
    if extra_modules in _discovered:
        return
    with _discovering:
        if extra_modules in _discovered:
            return
        try:
            autodiscover(extra_modules)
        finally:
            # Once, even when a configured module fails to import: that is
            # the configuration's error (raised here, to the first caller),
            # not something every job retries.
            _discovered.add(extra_modules)


def autodiscover(extra_modules: tuple = ()) -> None:
    """Import every installed app's ``tasks`` module and the extra modules."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for name in extra_modules:
        import_module(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaceholderTask(Task):
    """Stands for a task this process does not define, in the TaskResult of
    one of its jobs (``get_result``): its ``module_path`` is the row's task
    path; calling or enqueueing it raises UnknownTask. Never validated,
    never registered (the registry holds only tasks defined here)."""

    def __post_init__(self) -> None:
        pass

    def enqueue(self, *args, **kwargs):
        raise UnknownTask(self._unknown())

    async def aenqueue(self, *args, **kwargs):
        raise UnknownTask(self._unknown())

    def call(self, *args, **kwargs):
        raise UnknownTask(self._unknown())

    async def acall(self, *args, **kwargs):
        raise UnknownTask(self._unknown())

    def _unknown(self) -> str:
        return (
            f"The task {self.module_path!r} is not defined in this process (a placeholder of a "
            "job's result): import the code that defines it to call or enqueue it."
        )


def placeholder(task_path: str, backend: str) -> PlaceholderTask:
    """A PlaceholderTask whose ``module_path`` is ``task_path``."""

    def unknown_task(*args, **kwargs):
        raise UnknownTask(f"The task {task_path!r} is not defined in this process.")

    module, _, name = str(task_path).rpartition(".")
    unknown_task.__module__ = module or "<unknown>"
    unknown_task.__name__ = unknown_task.__qualname__ = name or str(task_path)
    return PlaceholderTask(func=unknown_task, backend=backend)
