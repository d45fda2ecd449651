"""Tasks of the limit by the shard key (docs/limits.md, "Limits by the shard
key"): which calls the key's owner keeps in its local queue (key_limited)
and which stay in the slot table (tests/integration/test_key_limits.py)."""

from shardq import shard_task


@shard_task(key="account", max_concurrency=2, limit_by="account")
def per_account(account: str, n: int = 0) -> int:
    """The local case: limit_by names the key's argument."""
    return n


def _account_of(args: tuple, kwargs: dict) -> object:
    return kwargs.get("account", args[0] if args else None)


@shard_task(key="account", max_concurrency=3, limit_by=_account_of)
def per_account_by_callable(account: str, n: int = 0) -> int:
    """Also local: a callable limit_by whose value is the shard key."""
    return n


@shard_task(key="account", max_concurrency=2, limit_by="region")
def per_region(account: str, region: str = "eu") -> str:
    """Not local: limited by another argument than its key."""
    return region


@shard_task(key="account", max_concurrency=2, limit_by="account", salt=4)
def per_account_salted(account: str) -> None:
    """Not local: salt spreads the key's jobs over 4 shards."""


@shard_task(key="account", max_concurrency=2, rate_limit="10/s", limit_by="account")
def per_account_with_rate(account: str) -> None:
    """Not local: a rate limit needs the table's tokens."""


@shard_task(key="account", max_concurrency=2, limit_by="account", ordered=True)
def per_account_ordered(account: str, n: int = 0) -> int:
    """Local and ordered: one at a time per key (the ordered gate, stricter)."""
    return n


@shard_task(key="account", max_concurrency=2, limit_by="account", unique_for=60)
def per_account_unique(account: str, n: int = 0) -> int:
    """Local, through the unique insert."""
    return n


@shard_task(takes_context=True, key="account", max_concurrency=2, limit_by="account")
def per_account_sleep(context, account: str, sleep: float = 0.1) -> str:
    """Logs to $SHARDQ_LIMIT_LEDGER like tests/taskapp/limit_tasks.py's tasks."""
    from tests.taskapp.limit_tasks import _run

    _run(context, sleep, account)
    return account
