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
        "tests.taskapp.runctl_tasks",
        "tests.taskapp.limit_tasks",
        "tests.taskapp.fair_tasks",
    ],
}
# The run-control tests start workers with a low zombie limit.
for _key in ("MAX_ZOMBIES", "ZOMBIE_GRACE"):
    if os.environ.get(f"SHARDQ_{_key}"):
        SHARDQ[_key] = (
            float(os.environ[f"SHARDQ_{_key}"]) if _key == "ZOMBIE_GRACE" else int(os.environ[f"SHARDQ_{_key}"])
        )
# The queue-limit test starts workers with limits in SHARDQ["QUEUES"] (JSON).
if os.environ.get("SHARDQ_TEST_QUEUES"):
    import json

    SHARDQ["QUEUES"] = json.loads(os.environ["SHARDQ_TEST_QUEUES"])
# Workers started by the periodic-task test import its schedules; no other
# process does (a per-second schedule would add jobs to every other test).
if os.environ.get("SHARDQ_TEST_PERIODIC"):
    SHARDQ["TASK_MODULES"] = [*SHARDQ["TASK_MODULES"], "tests.taskapp.periodic_tasks"]
