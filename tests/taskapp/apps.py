from django.apps import AppConfig


class TaskAppConfig(AppConfig):
    name = "tests.taskapp"
    label = "taskapp"
    default_auto_field = "django.db.models.BigAutoField"
