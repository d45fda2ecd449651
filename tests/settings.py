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
        "tests.taskapp.durable_tasks",
        # Workers resolve task paths from these modules only (a row's task
        # path is never imported: shardq/tasks/registry.py).
        "tests.taskapp.admin_tasks",
        "tests.taskapp.key_limit_tasks",
        "tests.taskapp.operator_tasks",
        "tests.taskapp.scale_tasks",
        "tests.taskapp.testing_tasks",
        "tests.taskapp.audit_tasks",
        "tests.taskapp.tracing_tasks",
        "tests.taskapp.fair_tasks",
        "tests.taskapp.joblog_tasks",
    ],
}
# Workers started by the process tier keep finished jobs in shardq_job for an
# hour before the archiver moves them to shardq_job_history (the default is
# 60 s): those tests count and read finished rows in shardq_job after minutes
# of running. tests/integration/test_history.py steps its own archiver with no
# grace; SHARDQ_HISTORY_GRACE sets it for a run.
SHARDQ["HISTORY_GRACE"] = float(os.environ.get("SHARDQ_HISTORY_GRACE", "3600"))
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
# The PgBouncer test (tests/acceptance/test_pgbouncer.py): DATABASE_URL goes
# through PgBouncer in transaction mode, marked as Django asks; workers
# connect directly through the "direct" alias (SHARDQ["WORKER_DATABASE"]).
if os.environ.get("SHARDQ_TEST_DIRECT_DATABASE_URL"):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # noqa: F405
    DATABASES["direct"] = env.db_url("SHARDQ_TEST_DIRECT_DATABASE_URL")  # noqa: F405
    SHARDQ["WORKER_DATABASE"] = "direct"
# Deploy safety (tests/acceptance/test_audit_processes.py): a worker started
# with SHARDQ_TEST_NEW_CODE runs the "new code", whose tasks the others
# cannot resolve; SHARDQ_UNKNOWN_TASK_TIMEOUT bounds how long such a job waits.
if os.environ.get("SHARDQ_TEST_NEW_CODE"):
    SHARDQ["TASK_MODULES"] = [*SHARDQ["TASK_MODULES"], "tests.taskapp.deploy_tasks"]
if os.environ.get("SHARDQ_UNKNOWN_TASK_TIMEOUT"):
    SHARDQ["UNKNOWN_TASK_TIMEOUT"] = float(os.environ["SHARDQ_UNKNOWN_TASK_TIMEOUT"])
# The tests' engine: Django's PostgreSQL backend with a flush that DELETEs
# from small tables instead of TRUNCATEing all of them (tests/pgtest/base.py:
# about 0.04 s against 0.7 s after every transactional test).
for _database in DATABASES.values():  # noqa: F405
    if _database.get("ENGINE") == "django.db.backends.postgresql":
        _database["ENGINE"] = "tests.pgtest"
# Django's default hasher runs PBKDF2 1,500,000 times a password (about a
# second of CPU here): every admin_client, create_user and login of the tests
# paid it. The tests check who may see and do what, never the hash, so they
# hash with MD5 as Django's own docs advise for tests ("Speeding up the tests").
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
