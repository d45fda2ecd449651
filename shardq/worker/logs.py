"""What a worker prints, whatever the project's ``LOGGING``.

Django's default logging sends nothing of the ``shardq`` logger anywhere
below WARNING, and that without a time. ``ensure_output()`` gives the
``shardq`` logger a stderr handler when no handler would receive its records
(neither its own nor the root's): then a worker of a new project prints its
start, shard changes, signals, failed jobs and stop. A project that
configures ``LOGGING`` for ``shardq`` or for the root logger is left alone.
"""

import logging
import sys
from collections.abc import Iterable

FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def ensure_output() -> None:
    """A stderr handler at INFO on the ``shardq`` logger, unless one would get its records."""
    logger = logging.getLogger("shardq")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def shard_ranges(shards: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` as ``"0-3,7,9-10"``: 64 shards fit a log line."""
    ordered = sorted(set(shards))
    parts = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts) or "none"
