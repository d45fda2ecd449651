"""Tasks of the operator-surface tests: a shard key that is a sensitive
argument, and one that is shown."""

from shardq import shard_task


@shard_task(key="token", sensitive=("token",))
def use_token(token: str, note: str = "") -> None:
    return None


@shard_task(key="account", sensitive=("password",))
def log_in(account: str, password: str) -> None:
    return None
