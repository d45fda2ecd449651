"""The workflow resolver of one worker process (see ``shardq/workflows.py``).

Off the completion path: the ack is the same statement with or without
workflows. A finished parent whose children have not been moved on is in
``shardq_job_resolve_idx``; this thread runs ``resolve_children`` over the
shards its worker holds, woken when the completer has written outcomes (and
at least every ``interval_seconds``, for parents finished some other way: a
cancel, a transactional completion, another pool's worker, a rescue).

State model: each pass is one statement, so a crash (the process, the
connection, the server) anywhere in it changes nothing and the parents stay
in the index for the next pass, here or at the shard's next owner. Passes
repeat while they come back full. Two resolvers over one shard (workers of
two pools) skip each other's parents (SKIP LOCKED); a child shared by two
parents on different shards (a fan-in) is locked in id order by each.
"""

import logging
import threading
import time
from collections.abc import Callable

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.resolver")

# Parents per pass: a fan-out parent's children are all moved in its pass.
BATCH = 256


class Resolver(Service):
    name = "resolver"

    def __init__(
        self,
        store: WorkerStore,
        shards: Callable[[], list[int]],
        stats: Stats,
        *,
        channel: str,
        notify: bool = True,
        interval_seconds: float = 1.0,
        batch: int = BATCH,
    ) -> None:
        super().__init__()
        self.store = store
        self.shards = shards
        self.stats = stats
        self.channel = channel
        self.notify = notify
        self.interval = interval_seconds
        self.batch = batch
        self._wake = threading.Event()
        self._unavailable = False

    def wake(self) -> None:
        self._wake.set()

    def interrupt(self) -> None:
        self._wake.set()

    def run(self) -> None:
        while not self.stopping:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self.stopping:
                break
            try:
                self.resolve()
                self._unavailable = False
            except DatabaseUnavailable as exc:
                # The parents stay in the index: the next pass does them.
                # Said once an outage (the leaser reports the outage itself).
                if not self._unavailable:
                    logger.warning("resolver: database unavailable (%s); retrying", exc)
                self._unavailable = True
                self._stop.wait(0.5)
            except StatementRejected as exc:
                self.stats.add("resolver_errors")
                logger.error("resolver: a pass was refused (%s); retrying at the next", exc)

    def finished(self) -> None:
        self.store.close()

    def resolve(self) -> int:
        """Passes until one comes back short; returns the children moved."""
        moved = 0
        while not self.stopping:
            shards = self.shards()
            if not shards:
                return moved
            started = time.monotonic()
            parents, children = self.store.resolve_children(shards, self.batch, self.channel, self.notify)
            if children:
                moved += len(children)
                self.stats.add("children_moved", len(children))
                failed = [row["id"] for row in children if row["status"] == "FAILED"]
                if failed:
                    self.stats.add("children_cancelled", len(failed))
                logger.debug(
                    "resolved %s parents, moved %s children in %.1f ms",
                    parents,
                    len(children),
                    (time.monotonic() - started) * 1000,
                )
            if parents < self.batch:
                return moved
        return moved
