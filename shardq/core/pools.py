"""Queue pools: the name of a worker's queue selection (DESIGN §4.8).

A pool is the set of queues a worker serves; shards are leased per pool, so
every pool covers every shard of its queues and the workers of one pool share
those shards out. The name is canonical (sorted, deduplicated), so
``--queues b,a`` and ``--queues a,b`` are one pool:

==============================  =====================
worker flags                    pool
==============================  =====================
(none)                          ``*``
``--queues emails``             ``emails``
``--queues reports,default``    ``default,reports``
``--exclude-queues emails``     ``*-emails``
``--backend other``             ``*@other``
==============================  =====================

Queue names cannot hold a comma (the flags split on it), so the name parses
back unambiguously (``pool_serves``).
"""

ALL = "*"
DEFAULT_BACKEND = "default"


def pool_name(queues: list[str] | None, exclude_queues: list[str] | None = None, backend: str | None = None) -> str:
    """The pool of a worker serving ``queues`` (None or empty: every queue but
    ``exclude_queues``) of the backend alias ``backend`` (None: the default)."""
    for queue in [*(queues or ()), *(exclude_queues or ())]:
        if queue.startswith(ALL):
            raise ValueError(
                f"queue name {queue!r} starts with {ALL!r}, which names every queue in a pool: "
                "a worker cannot serve it by name; rename the queue"
            )
    if queues:
        name = ",".join(sorted(set(queues)))
    elif exclude_queues:
        name = f"{ALL}-" + ",".join(sorted(set(exclude_queues)))
    else:
        name = ALL
    if backend not in (None, DEFAULT_BACKEND):
        name = f"{name}@{backend}"
    return name


def pool_serves(pool: str, queue: str, backend: str = DEFAULT_BACKEND) -> bool:
    """Does a worker of ``pool`` run jobs of ``queue`` enqueued through ``backend``?"""
    selection, _, alias = pool.rpartition("@") if "@" in pool else (pool, "", DEFAULT_BACKEND)
    if alias != backend:
        return False
    if selection == ALL:
        return True
    if selection.startswith(f"{ALL}-"):
        return queue not in selection[2:].split(",")
    return queue in selection.split(",")
