"""A module no one should import: it records being imported.

A job whose ``task_path`` names ``tests.taskapp.import_alarm.anything`` must
not make the admin import this module (its import-time code would run in the
web process). ``tests/isolation/test_operator_surfaces.py`` looks for the
alarm after viewing such a job.
"""

import os

os.environ["SHARDQ_IMPORT_ALARM"] = __name__
