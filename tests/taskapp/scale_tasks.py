"""Tasks of the scale tests (tests/scale): work that mostly sleeps, so many
worker processes fit on a small machine and the lease protocol, not the
tasks, is what is measured."""

import time

from shardq import shard_task


@shard_task()
def nap(seconds: float = 0.2) -> float:
    """Sleep ``seconds`` and return them."""
    time.sleep(seconds)
    return seconds
