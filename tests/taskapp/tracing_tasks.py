"""Tasks of the tracing tests (tests/integration/test_tracing.py)."""

from django.tasks import TaskContext

from shardq import exponential, shard_task


@shard_task(max_attempts=1, sensitive=("password",))
def sign_in(account: str, password: str) -> None:
    """Fails with its password in the message, as careless code does."""
    raise PermissionError(f"no account {account!r} with the password {password!r}")


@shard_task(takes_context=True, max_attempts=2, backoff=exponential(base=1.0, cap=0.0, jitter=0.0))
def fails_once(context: TaskContext) -> int:
    """Fails its first attempt, succeeds at its second (no database use)."""
    if context.attempt == 1:
        raise RuntimeError("attempt 1 fails on purpose")
    return context.attempt
