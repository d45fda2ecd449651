"""The "new code" of a deploy (tests/acceptance/test_audit_processes.py): only
a worker started with SHARDQ_TEST_NEW_CODE imports this module (tests/settings.py),
so the other workers cannot resolve its task."""

import os

from shardq import shard_task


@shard_task()
def added_in_this_release(n: int) -> dict:
    return {"n": n, "pid": os.getpid()}
