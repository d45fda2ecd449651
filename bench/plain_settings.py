"""The test settings as a project without limits would have them: Django's
default LOGGING (tests.isolation.default_logging_settings) and only
tests.taskapp.tasks as the workers' task modules (no task with a
concurrency, rate or key limit, so a worker's fetcher never runs the
limited claim: docs/limits.md, "no cost to those who do not use them").
For benchmarks of the unlimited path (bench/pickup.py --settings)."""

from tests.isolation.default_logging_settings import *  # noqa: F403

SHARDQ = {**SHARDQ, "TASK_MODULES": ["tests.taskapp.tasks"]}  # noqa: F405
