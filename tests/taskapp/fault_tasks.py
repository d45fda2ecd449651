"""Tasks of the fault tests (tests/faults/).

Every fault task first appends to the execution log (``taskapp_execution``)
over its own autocommit connection — an execution, whether or not its outcome
ever commits — and the ledger tasks then write their ledger row in the same
transaction as the job's fenced completion (``shardq.complete_in_transaction``),
so a ledger row exists exactly when the job's SUCCESSFUL outcome committed.
"""

import os
import signal
import threading
import time

import psycopg
from django.db import connection, transaction

import shardq
from shardq import exponential, shard_task
from shardq.db.store import connect

from .models import FaultLedger

# Fault tests kill backends whose application_name starts with 'shardq'; the
# task's own Django connection is one of them, the execution log is not (the
# log must record every execution the faults cause).
TASK_APPLICATION_NAME = "shardq-task"
LOG_APPLICATION_NAME = "faults-execlog"

_local = threading.local()

EXECUTION_SQL = (
    "INSERT INTO taskapp_execution (job_id, attempt, fence, worker, pid, at) "
    "VALUES (%s, %s, %s, %s, %s, clock_timestamp())"
)


def log_execution(context) -> None:
    """Append (job, attempt, fence, worker) to the execution log, autocommit."""
    row = (int(context.task_result.id), context.attempt, context.fence, context.task_result.worker_ids[-1], os.getpid())
    for attempt in (1, 2):
        conn = getattr(_local, "log_conn", None)
        try:
            if conn is None or conn.closed:
                conn = _local.log_conn = connect(application_name=LOG_APPLICATION_NAME)
            conn.execute(EXECUTION_SQL, row)
            return
        except (psycopg.OperationalError, psycopg.InterfaceError, shardq.DatabaseUnavailable):
            _local.log_conn = None
            if attempt == 2:
                raise


def name_task_connection() -> None:
    """Tag this thread's Django connection so fault tests can kill it too."""
    connection.ensure_connection()
    raw = connection.connection
    if raw.info.parameter_status("application_name") != TASK_APPLICATION_NAME:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('application_name', %s, false)", [TASK_APPLICATION_NAME])


def commit_with_ledger(context, return_value) -> None:
    """The job's fenced SUCCESSFUL mark and its ledger row, one transaction."""
    with transaction.atomic():
        version = shardq.complete_in_transaction(context, return_value=return_value)
        FaultLedger.objects.create(
            job_id=int(context.task_result.id),
            attempt=context.attempt,
            fence=context.fence,
            shard_version=version,
            worker=context.task_result.worker_ids[-1],
        )


QUICK_RETRY = exponential(base=1.0, cap=0.2, jitter=0.0)


@shard_task(takes_context=True, max_attempts=10, backoff=QUICK_RETRY)
def tx_ledger(context, n: int = 0, sleep: float = 0.0) -> int:
    """Log the execution, work ``sleep`` seconds, commit outcome + ledger row together."""
    name_task_connection()
    log_execution(context)
    if sleep:
        time.sleep(sleep)
    commit_with_ledger(context, n)
    return n


@shard_task(takes_context=True, max_attempts=10, backoff=QUICK_RETRY)
def acked(context, n: int = 0, sleep: float = 0.0) -> int:
    """Log the execution and return: the outcome goes through the completer's batched ack."""
    log_execution(context)
    if sleep:
        time.sleep(sleep)
    return n


@shard_task(takes_context=True)
def poison(context) -> None:
    """Kills its own worker process on every attempt (after logging it).
    Default options, as users keep them: max_attempts=1, on_worker_lost="retry"."""
    log_execution(context)
    os.kill(os.getpid(), signal.SIGKILL)


@shard_task(takes_context=True, max_attempts=1, on_worker_lost="fail")
def poison_once(context) -> None:
    log_execution(context)
    os.kill(os.getpid(), signal.SIGKILL)


@shard_task(key="key", ordered=True, takes_context=True, max_attempts=10, backoff=QUICK_RETRY)
def ordered_ledger(context, key: int, n: int = 0, sleep: float = 0.0) -> int:
    """tx_ledger for an ordered key: a key's jobs must run one after another, in id order."""
    name_task_connection()
    log_execution(context)
    if sleep:
        time.sleep(sleep)
    commit_with_ledger(context, n)
    return n


@shard_task(takes_context=True)
def logged(context, n: int = 0, sleep: float = 0.0) -> int:
    """Log the execution, work ``sleep`` seconds; the default max_attempts (1),
    as users keep it: only a worker loss runs it again."""
    log_execution(context)
    if sleep:
        time.sleep(sleep)
    return n
