"""shardq's one exception tree. Configuration errors are ImproperlyConfigured;
bad tasks and arguments are Django's ``InvalidTask``."""

from django.core.exceptions import ImproperlyConfigured


class ShardqError(Exception):
    """Base of every error shardq raises at run time."""


class UnknownTask(ShardqError):
    """A job names a task path that does not resolve to a registered Task."""


class DatabaseUnavailable(ShardqError):
    """The worker cannot reach PostgreSQL (the circuit breaker is open)."""


class FenceLost(ShardqError):
    """A fenced write matched no row: this attempt's claim is no longer current.

    Raised by ``shardq.complete_in_transaction`` (and ``shardq.fenced``) when
    the job was taken over, rescued or moved on since this worker claimed it;
    the surrounding ``transaction.atomic()`` then rolls the task's own writes
    back with it. The worker counts it as a fence rejection, never retries it.
    """


class WorkerLost(ShardqError):
    """Recorded on a job whose worker stopped before writing its outcome."""


class Cancelled(ShardqError):
    """Recorded on a job cancelled with ``shardq.cancel()``."""


class TaskTimeout(ShardqError):
    """A task ran past its ``timeout``.

    Recorded on the job (FAILED, or READY for a retry while attempts remain)
    at the deadline; raised inside a sync task's thread by the worker (an
    asynchronous exception, delivered at the thread's next bytecode) and by
    ``context.check_timeout()``. The worker raises the class itself, so the
    message is this default one."""

    def __init__(self, message: str = "the task ran past its timeout") -> None:
        super().__init__(message)


class LoggedTaskError(ShardqError):
    """Stands in for a task's exception in the ``task_finished`` log record
    (Django's receiver logs ``sys.exc_info()``) when the exception's own
    text may not be logged as it is: too long, or holding the value of an
    argument the task marks ``sensitive``. Its message is the exception's
    class and message, bounded, with those values hidden; its traceback is
    the exception's."""


class ShardqConfigurationError(ImproperlyConfigured):
    """shardq's settings are invalid."""


from django.core.management.base import SystemCheckError  # noqa: E402


class ShardqNotInstalled(ShardqConfigurationError, SystemCheckError):
    """A task is defined on a shardq backend while "shardq" is not in
    INSTALLED_APPS (check shardq.E009). Raised when the task is defined.

    Without the app nothing of shardq's may be imported before Django's
    checks run, so the check alone never runs in a project whose tasks are
    imported by its URLconf (the URL check imports them, after the list of
    checks is fixed). A ``SystemCheckError`` too: ``manage.py check`` (and
    every command that runs the checks) prints it as a check's report, with
    no traceback, and exits 1."""


# -- error domains (DESIGN §5): the lead's additions ---------------------------


class StatementRejected(ShardqError):
    """PostgreSQL refused a statement because of the data it carried (SQLSTATE
    class 22 data exception, 23 integrity, 54 program limit exceeded, ...).

    Never "database unavailable": sending the same statement again fails the
    same way. A batch that raises it is split until the one bad row is found
    (``WorkerStore.run_split``); only that row fails."""

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class TablesMissing(StatementRejected):
    """A statement met a missing shardq table (SQLSTATE 42P01 on a
    ``shardq_*`` relation): ``manage.py migrate`` has not created them in
    this database yet. Raised by the worker's store, enqueue and the
    statements of the commands and the admin."""

    def __init__(self, detail: str = "", sqlstate: str | None = "42P01"):
        self.detail = detail
        super().__init__(
            f"shardq's tables are missing: run manage.py migrate{f' ({detail})' if detail else ''}", sqlstate
        )


class UnreadableJob(ShardqError):
    """Recorded on a row quarantined at claim: a value shardq cannot read
    (an out-of-range counter, an infinite time, a non-array ``errors``...)."""


class ResultTooLarge(ShardqError):
    """A task returned more JSON than ``SHARDQ["MAX_RESULT_BYTES"]``."""


class OutcomeRejected(ShardqError):
    """PostgreSQL refused to store a job's outcome (its return value or error
    text); the job is failed with this error instead."""


# -- bad input (issue 10) --------------------------------------------------------

from django.tasks.exceptions import InvalidTask  # noqa: E402


class ArgumentNotJSON(InvalidTask, TypeError):
    """An argument (or a key built from one) is not a JSON value.

    Both Django's ``InvalidTask`` and a ``TypeError``: Django's own backends
    let ``json`` raise ``TypeError("Object of type datetime is not JSON
    serializable")``, and code written against them catches that."""


# -- workflows (issue 16) ----------------------------------------------------------


class ParentFailed(ShardqError):
    """Recorded on a workflow job that will not run because a parent ended
    FAILED (dead-lettered or cancelled) and the job kept the default
    ``on_parent_failure="cancel"``; its traceback names the parent job."""


class WorkflowError(InvalidTask, ValueError):
    """A workflow graph that cannot be enqueued: a cycle, an unknown parent,
    a step of another workflow, a bad ``on_parent_failure``. Nothing is stored."""


# -- durable long jobs (issue 26) ----------------------------------------------------


class SignalTimeout(ShardqError):
    """Raised in a task by ``context.wait_for(name, timeout=...)`` when no
    signal of that name arrived within the timeout (recorded: a replay raises
    it again)."""


class DuplicateStep(ShardqError, ValueError):
    """Two durable calls of one job run used the same name (``context.step``
    twice with one name, or a name a step, an iteration or a wait already
    holds): each name records one result."""


class SignalRefused(ShardqError, ValueError):
    """``shardq.signal`` to a job that has finished (SUCCESSFUL or FAILED):
    no wait of it could ever consume the signal. Nothing is stored."""


class DurableNeedsSyncTask(ShardqError, TypeError):
    """A durable call (``context.step``, ``iterate``, ``sleep``,
    ``sleep_until``, ``wait_for``) in an ``async def`` task: durable jobs are
    sync tasks (a batch's writes and its cursor share the task thread's
    connection and transaction). Declare the task with ``def``."""


class DurableStop(BaseException):
    """Control flow of durable jobs, not an error: the attempt ends at a
    boundary and the worker writes the transition (shardq/durable.py).

    A ``BaseException``, as ``GeneratorExit`` is, so that a task's ``except
    Exception`` does not swallow it; the worker catches it around the task."""


class Suspended(DurableStop):
    """``context.sleep``/``sleep_until``/``wait_for``: the job is suspended
    until ``until`` (None: a wait with no timeout) or its signal."""

    def __init__(self, until, wait_name: str | None = None) -> None:
        super().__init__(f"suspended until {until or 'a signal'}")
        self.until = until
        self.wait_name = wait_name


class Interrupted(DurableStop):
    """The job reached a boundary (between steps, between batches) while its
    worker stops, its shard is handed over, or it was cancelled:
    ``reason`` is ``"shutdown"``, ``"handover"`` or ``"cancel"``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"interrupted at a boundary ({reason})")
        self.reason = reason
