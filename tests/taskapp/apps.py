import os

from django.apps import AppConfig


class TaskAppConfig(AppConfig):
    name = "tests.taskapp"
    label = "taskapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        if os.environ.get("SHARDQ_TEST_COUNT_LOG_RECORDS"):
            from .log_records import install

            install()
