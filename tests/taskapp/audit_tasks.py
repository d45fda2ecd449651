"""Tasks of the security audit's tests (tests/integration/test_security_audit.py,
tests/acceptance/test_audit_processes.py)."""

import os
import time

from shardq import shard_task


@shard_task(max_concurrency=2, limit_by="api_token", sensitive=("api_token",))
def call_api(account: str, api_token: str) -> None:
    return None


@shard_task(max_concurrency=2, key="api_token", limit_by="api_token", sensitive=("api_token",))
def call_api_by_key(api_token: str) -> None:
    return None


@shard_task(max_concurrency=2, limit_by="customer")
def per_customer(customer: str) -> None:
    return None


@shard_task(sensitive=("password",))
def fail_loudly(account: str, password: str, size: int = 0) -> None:
    raise ValueError(f"could not log in {account} with {password!r}: " + "x" * size)


@shard_task()
def crash() -> None:
    """Kills its own process, as a segfault in C code would."""
    os._exit(17)


@shard_task()
def innocent(n: int, seconds: float = 0.0) -> int:
    time.sleep(seconds)
    return n


@shard_task(timeout=4.0)
def overruns(seconds: float) -> None:
    time.sleep(seconds)
