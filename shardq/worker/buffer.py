"""The blocking face of the local queue: executors wait here for work.

``shardq.core.localqueue.LocalQueue`` is the structure (lanes, heaps, per-key
FIFO, drop by shard); this wrapper adds the condition variable executors
sleep on, per-shard counts of processing jobs, which the leaser needs
before it may release a shard, and counts of buffered jobs by priority, so
the worker knows the lowest priority waiting here (a NOTIFY of a higher one
is claimed out of turn, see ``Worker.outranking_claim``).
"""

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..core.hashing import lane_count
from ..core.localqueue import LocalQueue, QueuedJob
from .jobs import ClaimedJob

if TYPE_CHECKING:
    from ..fairness import FairBy, FairWeights
    from ..limits import KeyCaps

# Full fair keys a claim passes over, at most (Buffer.full_fair_keys).
MAX_FULL_FAIR_KEYS = 256


class Buffer:
    # Every QueuedJob pushed here carries its ClaimedJob as the payload, hence
    # the casts where a payload comes back.

    def __init__(
        self,
        capacity: int,
        lanes: int | None = None,
        key_cap: "KeyCaps | None" = None,
        fair_weight: "FairWeights | None" = None,
        fair_by_time: "FairBy | None" = None,
        fair_room: Callable[[], None] | None = None,
    ) -> None:
        self.queue = LocalQueue(lanes or lane_count(os.cpu_count() or 1), capacity)
        self.capacity = capacity
        # Fairness (docs/fairness.md): a fair key's weight from settings (a
        # job's own fair_weight wins), and whether a task's share counts
        # measured time. None: every fair job weighs 1 and counts starts.
        self.fair_weight = fair_weight
        self.fair_by_time = fair_by_time
        # The fair keys the last claim passed over (buffered to their share)
        # and the count under which one wakes the fetcher (watch_fair_keys).
        self._fair_watch: dict[str, int] = {}
        self.fair_room = fair_room
        # task path -> its max_concurrency per shard key (None: not limited
        # here), for key_limited jobs (docs/limits.md, "Limits by the shard key").
        self.key_cap = key_cap
        self._ready = threading.Condition(threading.Lock())
        # Threads asleep in pop, waiting for a job (under _ready's lock).
        self.waiting = 0
        self._processing_by_shard: Counter[int] = Counter()
        # Buffered jobs by priority: counted before they are pushed and
        # uncounted as they leave, under _count_lock, so a job in the queue
        # is always counted (a count may briefly include one being pushed).
        self._priorities: Counter[int] = Counter()
        self._count_lock = threading.Lock()

    @property
    def free(self) -> int:
        return self.queue.free

    @property
    def buffered(self) -> int:
        return self.queue.buffered

    @property
    def processing(self) -> int:
        return self.queue.processing

    def push_many(self, jobs: list[ClaimedJob]) -> list[ClaimedJob]:
        """Buffer claimed jobs; returns those that could not be (to hand back).

        A job id already here (buffered or running) was claimed again after a
        rescue while its older copy is still in memory: the new claim is
        handed back rather than run twice side by side.
        """
        now = time.time()
        with self._count_lock:
            self._priorities.update(job.priority for job in jobs)
        # One round of the local queue's locks for the claim (push_many).
        refused = [
            cast(ClaimedJob, queued.payload)
            for queued in self.queue.push_many(
                [self._queued(job) for job in jobs],
                now,
            )
        ]
        if refused:
            with self._count_lock:
                for job in refused:
                    self._uncount(job.priority)
        with self._ready:
            self._ready.notify(len(jobs) - len(refused))
        return refused

    def _queued(self, job: ClaimedJob) -> QueuedJob:
        """A claimed job as the local queue holds it. A key_limited job is
        gated at most its task's max_concurrency of its shard key at once,
        on a key of its own (NUL never occurs in a task path or a shard key,
        so it cannot meet an ordered job's key). It is ungated when the task
        is not defined here with a cap (an unknown task fails as it would
        anyway) or the row has no key; an ordered job keeps its
        one-at-a-time gate, which is stricter."""
        key_cap = self.key_cap
        if job.key_limited and not job.ordered and job.shard_key is not None and key_cap is not None:
            cap = key_cap(job.task_path)
            if cap:
                gated = QueuedJob(
                    job.id,
                    job.queue_name,
                    job.priority,
                    job.run_after,
                    job.shard,
                    f"\0{job.task_path}\0{job.shard_key}",
                    False,
                    job,
                    cap,
                )
                if job.fair_key is not None:
                    self._fair(gated, job)
                return gated
        queued = QueuedJob(
            job.id, job.queue_name, job.priority, job.run_after, job.shard, job.shard_key, job.ordered, job
        )
        if job.fair_key is not None:
            self._fair(queued, job)
        return queued

    def _fair(self, queued: QueuedJob, job: ClaimedJob) -> None:
        """Set a fair job's key, weight and measure in the local queue."""
        key = job.fair_key
        queued.fair_key = key
        if job.fair_weight is not None and job.fair_weight > 0:
            queued.fair_weight = float(job.fair_weight)
        elif self.fair_weight is not None and key is not None:
            queued.fair_weight = self.fair_weight(key)
        if self.fair_by_time is not None:
            queued.fair_by_time = self.fair_by_time(job.task_path)

    @property
    def held_back(self) -> int:
        """key_limited jobs waiting here for their key's gate (LocalQueue.held_back)."""
        return self.queue.held_back

    def full_keys(self) -> list[tuple[str, str]]:
        """(task path, shard key) of each key_limited key with jobs waiting
        at its gate: the claim passes over their jobs until it opens."""
        return [_task_and_key(gate) for gate in self.queue.full_keys()]

    @property
    def fair_crowded(self) -> bool:
        """Has a fair key two jobs or more here (the claim goes key by key)?"""
        return self.queue.fair_crowded

    @property
    def has_fair(self) -> bool:
        """Are jobs with a fair key buffered here?"""
        return self.queue.has_fair

    def full_fair_keys(self, room: int) -> list[str]:
        """Fair keys buffered to their share of ``room`` (LocalQueue's
        full_fair_keys): the claim passes over them until they run down
        (docs/fairness.md). They are watched from now: once one of them has
        less than half its share left here, ``fair_room`` is called (the
        fetcher claims again), so a key that runs fast (fair by time, or a
        heavy weight) is refilled before it runs dry."""
        full = self.queue.full_fair_keys(room)
        self._fair_watch = {key: max(1, share // 2) for key, share in full.items()}
        if len(full) > MAX_FULL_FAIR_KEYS:
            # The claim tests each key it walks against the list: the keys
            # with the most jobs here first (the others may come once more).
            backlog = self.queue.fair_backlog_of
            return sorted(full, key=backlog, reverse=True)[:MAX_FULL_FAIR_KEYS]
        return list(full)

    def _popped_fair(self, jobs: list[QueuedJob]) -> None:
        """Wake the fetcher when a watched fair key ran below its low mark."""
        watch = self._fair_watch
        backlog = self.queue.fair_backlog_of
        for queued in jobs:
            key = queued.fair_key
            if key is not None and key in watch and backlog(key) < watch[key]:
                self._fair_watch = {}
                if self.fair_room is not None:
                    self.fair_room()
                return

    def _uncount(self, priority: int) -> None:
        """One buffered job of ``priority`` fewer (caller holds _count_lock)."""
        left = self._priorities[priority] - 1
        if left:
            self._priorities[priority] = left
        else:
            del self._priorities[priority]

    def lowest_priority(self) -> int | None:
        """The lowest priority of a buffered job (None: none buffered).

        Read without the lock, a snapshot like the sizes: min() over a dict
        of ints is one C call under the GIL. Taking the lock here was slow:
        the starter pops jobs one lock round each, and on a busy worker a
        reader waited tens of milliseconds for its turn (measured)."""
        return min(self._priorities, default=None)

    def _pop_counted(self, now: float, min_priority: int | None = None) -> QueuedJob | None:
        """Pop one job and count it as processing in its shard, atomically.

        Counted under the same lock as the pop: a job popped but not yet
        counted would be in neither ``drop_shard`` (it left the queue) nor
        ``processing_in_shard``, and the leaser could release its shard with
        the job still CLAIMED (see Leaser._finish_draining)."""
        with self._count_lock:
            queued = self.queue.pop(now, min_priority)
            if queued is not None:
                self._processing_by_shard[queued.shard] += 1
                self._uncount(queued.priority)
                if self._fair_watch:
                    self._popped_fair([queued])
            return queued

    def pop(self, timeout: float) -> ClaimedJob | None:
        queued = self._pop_counted(time.time())
        if queued is None:
            with self._ready:
                queued = self._pop_counted(time.time())
                if queued is None:
                    due = self.queue.next_due()
                    if due is not None:
                        # A claimed job becomes due soon: wake for it on time.
                        timeout = max(0.0, min(timeout, due - time.time()))
                    self.waiting += 1
                    try:
                        self._ready.wait(timeout)
                    finally:
                        self.waiting -= 1
                    queued = self._pop_counted(time.time())
                    if queued is None:
                        return None
        return cast(ClaimedJob, queued.payload)

    def processing_jobs(self) -> list[ClaimedJob]:
        """The jobs popped and not yet done (a snapshot, for shutdown logs)."""
        return [cast(ClaimedJob, queued.payload) for queued in list(self.queue._processing.values())]

    def done(self, job: ClaimedJob) -> None:
        with self._count_lock:
            left = self._processing_by_shard[job.shard] - 1
            if left:
                self._processing_by_shard[job.shard] = left
            else:
                del self._processing_by_shard[job.shard]
        # A fair_by="time" job's measured run time is charged to its fair key.
        self.queue.done(job.id, job.ran_seconds)
        if job.ordered or job.key_limited:
            # The key's next job may now be admitted to its lane.
            with self._ready:
                self._ready.notify()

    def holds(self, job_id: int) -> bool:
        return job_id in self.queue

    def processing_in_shard(self, shard: int) -> int:
        with self._count_lock:
            return self._processing_by_shard.get(shard, 0)

    def drop_shard(self, shard: int) -> list[ClaimedJob]:
        with self._count_lock:
            dropped = self.queue.drop_shard(shard)
            for queued in dropped:
                self._uncount(queued.priority)
        return [cast(ClaimedJob, queued.payload) for queued in dropped]

    def drop_queues(self, queues: frozenset[str]) -> list[ClaimedJob]:
        """Every buffered job of these (newly paused) queues, out of the queue."""
        with self._count_lock:
            dropped = self.queue.drop_queues(queues)
            for queued in dropped:
                self._uncount(queued.priority)
        return [cast(ClaimedJob, queued.payload) for queued in dropped]

    def held_by_queue(self) -> dict[str, int]:
        """Jobs buffered or processing here, by queue (a snapshot)."""
        return self.queue.count_by_queue()

    def drain(self) -> list[ClaimedJob]:
        with self._count_lock:
            drained = self.queue.drain()
            for queued in drained:
                self._uncount(queued.priority)
        return [cast(ClaimedJob, queued.payload) for queued in drained]

    def wake_all(self) -> None:
        with self._ready:
            self._ready.notify_all()


def _task_and_key(gate: str) -> tuple[str, str]:
    """(task path, shard key) of a key_limited job's gate key (see Buffer._queued)."""
    _, task_path, shard_key = gate.split("\0", 2)
    return task_path, shard_key
