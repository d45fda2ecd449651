"""The app's own system check (shardq.W001, registered by ``apps.ready``).

Apart from ``checks.py`` because it needs the backend class, and the
backend imports ``checks.py`` for the checks it runs itself.
"""

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from .backend import ShardqBackend


def app_without_backend(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """shardq.W001, registered by the app: installed, but no backend uses it."""
    for config in (getattr(settings, "TASKS", None) or {}).values():
        try:
            backend_class = import_string(config.get("BACKEND", ""))
        except (ImportError, AttributeError):
            continue
        if isinstance(backend_class, type) and issubclass(backend_class, ShardqBackend):
            return []
    return [
        checks.Warning(
            "'shardq' is in INSTALLED_APPS but no TASKS backend is shardq's: tasks are not stored by shardq "
            "and shardq_worker has nothing to serve.",
            hint="Set TASKS = {'default': {'BACKEND': 'shardq.backend.ShardqBackend'}} (docs/configuration.md).",
            id="shardq.W001",
        )
    ]
