"""Tasks the admin's browser tests enqueue: arguments marked sensitive, and
one that is not."""

from shardq import shard_task


@shard_task(key="account", max_attempts=3, sensitive=("password",))
def sign_in(account: str, password: str, remember: bool = False) -> str:
    return account


@shard_task(sensitive=True)
def rotate_token(token: str, *, note: str = "") -> None:
    return None


@shard_task(key="order_id", max_attempts=2)
def ship(order_id: int, carrier: str = "post") -> int:
    return order_id


@shard_task(key="customer_id", tags=["billing"], sensitive=("card",), max_attempts=2)
def charge(customer_id: int, amount: int = 0, card: str = "") -> int:
    """Found by its tag and by customer_id=... (docs/admin.md, "Tags and search")."""
    return amount
