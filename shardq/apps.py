from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ShardqConfig(AppConfig):
    name = "shardq"
    verbose_name = "shardq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks  # noqa: F401  (registers the system checks)
        from .db.store import ensure_shards

        post_migrate.connect(ensure_shards, sender=self, dispatch_uid="shardq_ensure_shards")
