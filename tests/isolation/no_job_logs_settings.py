"""Django's default LOGGING, per-job logs off (``JOB_LOG_BYTES = 0``): the
"off" side of ``bench/ab_job_logs.py``."""

from tests.isolation.default_logging_settings import *  # noqa: F403

SHARDQ = {**SHARDQ, "JOB_LOG_BYTES": 0}  # noqa: F405
