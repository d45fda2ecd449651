"""The app's own system checks (shardq.W001, shardq.E013, registered by
``apps.ready``).

Apart from ``checks.py`` because it needs the backend class, and the
backend imports ``checks.py`` for the checks it runs itself.
"""

import difflib

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from .backend import ShardqBackend


def shardq_backends() -> dict[str, dict]:
    """{alias: its TASKS entry} of the backends that are shardq's."""
    found = {}
    for alias, config in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend_class = import_string(config.get("BACKEND", ""))
        except (ImportError, AttributeError):
            continue
        if isinstance(backend_class, type) and issubclass(backend_class, ShardqBackend):
            found[alias] = config
    return found


def queues_no_backend_has(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """shardq.E013, registered by the app: SHARDQ["QUEUES"] names a queue
    that no shardq backend's QUEUES allows (no task can use it, so its limit
    never applies: a misspelling, most often)."""
    raw = getattr(settings, "SHARDQ", {}).get("QUEUES")
    if not isinstance(raw, (dict, list, tuple)):
        return []  # None, or a bad value: ImproperlyConfigured at start (limits.py)
    backends = shardq_backends()
    allowed: set[str] = set()
    for config in backends.values():
        queues = config.get("QUEUES", ["default"])  # Django's default
        if not queues:
            return []  # an empty list allows any queue name
        allowed.update(queues)
    if not backends:
        return []  # W001's to report
    configured = ", ".join(
        f"TASKS[{alias!r}]['QUEUES'] = {list(c.get('QUEUES', ['default']))!r}" for alias, c in backends.items()
    )
    errors: list[checks.CheckMessage] = []
    for name in raw:
        if not isinstance(name, str) or name in allowed:
            continue
        close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
        errors.append(
            checks.Error(
                f"SHARDQ['QUEUES'] names the queue {name!r}, which no shardq backend has ({configured})"
                + (f": did you mean {close[0]!r}?" if close else "."),
                hint="Add the queue to a backend's TASKS[...]['QUEUES'] (a task's queue_name must be one of "
                "them), or correct the name in SHARDQ['QUEUES'].",
                id="shardq.E013",
            )
        )
    return errors


def app_without_backend(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """shardq.W001, registered by the app: installed, but no backend uses it."""
    if shardq_backends():
        return []
    return [
        checks.Warning(
            "'shardq' is in INSTALLED_APPS but no TASKS backend is shardq's: tasks are not stored by shardq "
            "and shardq_worker has nothing to serve.",
            hint="Set TASKS = {'default': {'BACKEND': 'shardq.backend.ShardqBackend'}} (docs/configuration.md).",
            id="shardq.W001",
        )
    ]
