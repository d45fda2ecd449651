"""The bench's worker settings with no limited task (bench/e2e.py's
default is Django's default LOGGING over tests.settings): the example
project's demo app defines one (``example_project.demo.tasks.send_receipt``)
and the test task modules many, so there a worker's fetcher runs the limited
claim after every ordinary claim, which a project without limits never does
(docs/limits.md). Here: no demo app, and ``tests.taskapp.tasks`` (``noop``)
as the only task module. For benchmarks of the unlimited path
(``bench/pickup.py --settings bench.plain_settings``)."""

from tests.isolation.default_logging_settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "example_project.demo"]  # noqa: F405
SHARDQ = {**SHARDQ, "TASK_MODULES": ["tests.taskapp.tasks"]}  # noqa: F405
# The demo's URLs import its models: no URLs (a worker serves none).
ROOT_URLCONF = __name__
urlpatterns: list = []
