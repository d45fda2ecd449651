"""The task registry: a worker resolves the task paths rows name through it
only (it never imports an arbitrary callable a row names)."""

from importlib import import_module

from django.apps import apps
from django.tasks import Task

from ..exceptions import UnknownTask

# Tasks register themselves when they are defined (validate_task runs in
# Task.__post_init__); the worker resolves task paths here only.
_registry: dict[str, Task] = {}


def register(task: Task) -> None:
    _registry.setdefault(task.module_path, task)


def registered_task_paths() -> list[str]:
    """The task paths defined (imported) in this process so far."""
    return list(_registry)


def resolve(task_path: str, extra_modules: tuple = ()) -> Task:
    """The Task a job's ``task_path`` names.

    Looks in the registry; failing that, imports the path's module only when
    it belongs to an installed app or to ``SHARDQ["TASK_MODULES"]`` and the
    attribute is a Task instance. Nothing else is ever imported or called.
    """
    task = _registry.get(task_path)
    if task is not None:
        return task
    module_name, _, attr = task_path.rpartition(".")
    allowed = [cfg.name for cfg in apps.get_app_configs()] + list(extra_modules)
    if not module_name or not any(module_name == root or module_name.startswith(root + ".") for root in allowed):
        raise UnknownTask(
            f"No task {task_path!r} is registered and its module is not part of an installed "
            "app: define the task in an installed app (or list its module in "
            "SHARDQ['TASK_MODULES'])."
        )
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise UnknownTask(f"Task {task_path!r} cannot be imported: {exc}") from exc
    except Exception as exc:
        # A row may name any module of an installed app, and one can fail to
        # import in other ways (a module-level bug, a half-deployed file):
        # that is its job's failure, never the thread's that resolves it.
        raise UnknownTask(f"Task {task_path!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise UnknownTask(f"Task {task_path!r} does not exist: {module_name} has no {attr!r}.")
    if not isinstance(obj, Task):
        raise UnknownTask(
            f"{task_path!r} is a {type(obj).__name__}, not a Task: decorate it with @task or @shard_task."
        )
    _registry.setdefault(task_path, obj)
    return obj


def autodiscover(extra_modules: tuple = ()) -> None:
    """Import every installed app's ``tasks`` module and the extra modules."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for name in extra_modules:
        import_module(name)
