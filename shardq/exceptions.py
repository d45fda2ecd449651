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


class ShardqConfigurationError(ImproperlyConfigured):
    """shardq's settings are invalid."""
