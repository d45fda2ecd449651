from django.apps import AppConfig
from django.core import checks
from django.core.signals import setting_changed
from django.db.models.signals import post_migrate


def _reset_backends(*, setting, **kwargs):
    """Backends read settings.SHARDQ when built: rebuild them when it changes
    (django.tasks does the same for TASKS)."""
    if setting == "SHARDQ":
        from asgiref.local import Local
        from django.tasks import task_backends

        task_backends._connections = Local()


class ShardqConfig(AppConfig):
    name = "shardq"
    verbose_name = "shardq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # django.tasks registers the check that runs each backend's check()
        # (shardq.E001...) when it is imported: import it, so `check` runs them
        # even in a project that has not imported a task yet.
        import django.tasks  # noqa: F401

        from .app_checks import app_without_backend, queues_no_backend_has
        from .db.store import ensure_shards, sync_history_columns
        from .dispatch import settings_changed
        from .limits import configured_queue_limits
        from .worker.metrics import enable_if_configured

        checks.register(app_without_backend)
        checks.register(queues_no_backend_has)
        # SHARDQ["QUEUES"]' limits: a bad one stops the process at start,
        # with a message naming the queue and the option.
        configured_queue_limits()

        post_migrate.connect(ensure_shards, sender=self, dispatch_uid="shardq_ensure_shards")
        post_migrate.connect(sync_history_columns, sender=self, dispatch_uid="shardq_sync_history_columns")
        enable_if_configured()
        setting_changed.connect(_reset_backends, dispatch_uid="shardq_reset_backends")
        # DEBUG decides what Django's default log handlers emit (dispatch.py).
        setting_changed.connect(settings_changed, dispatch_uid="shardq_log_verdicts")
