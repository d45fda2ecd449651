"""Test settings: the example project plus the test task app."""

import os

os.environ.setdefault("DJANGO_EXTRA_APPS", "tests.taskapp")

from example_project.settings import *  # noqa: F403

SHARDQ = {
    **SHARDQ,  # noqa: F405
    "TASK_MODULES": [
        "tests.taskapp.tasks",
        "tests.taskapp.fault_tasks",
        "tests.taskapp.isolation_tasks",
        "tests.taskapp.limit_tasks",
    ],
}
# Workers started by the periodic-task test import its schedules; no other
# process does (a per-second schedule would add jobs to every other test).
if os.environ.get("SHARDQ_TEST_PERIODIC"):
    SHARDQ["TASK_MODULES"] = [*SHARDQ["TASK_MODULES"], "tests.taskapp.periodic_tasks"]
