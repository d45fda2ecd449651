"""The worker's local sharded queue: claimed jobs between fetch and execution.

The fetcher pushes jobs it has claimed; executor threads pop the best one,
run it and call ``done``. Everything is in memory and bounded by
``capacity`` (buffered + processing), which is what makes the fetcher
demand-driven: it asks the database for ``free`` jobs at most.

Where a buffered job lives
--------------------------
* **delayed index** — ``run_after > now`` at push time; a time-ordered index
  (the skip list up to 2k capacity, else SortedList: whichever measured
  faster at that size, see :mod:`shardq.core.skiplist`). Every ``pop``
  first moves everything due into the lanes (one range pop).
* **lane** — ready to run. ``lane = FNV-1a(queue name) & (lane_count - 1)``;
  each lane is an indexed priority queue (:mod:`shardq.core.heap`) ordered by
  (-priority, run_after, sequence). One sequence counter is shared by all
  lanes, so FIFO ties break the same way across lanes. ``pop`` takes the best
  head over the non-empty lanes.
* **key wait list** — a *gated* job whose key already has as many jobs in
  lanes or in processing as it allows. An ``ordered`` job allows one: per-key
  FIFO, each key has at most one *holder* (the job in a lane or
  processing). A job with a ``cap`` (a limit partitioned by its shard key,
  docs/limits.md) allows ``cap`` holders of its key. The rest wait, in the
  order they became ready, and the next one enters its lane only when a
  holder is ``done`` (or removed by ``drop_shard``/``drain``). The gate is on
  the key string alone, across queues (the worker writes a capped job's key
  as NUL + task path + NUL + shard key: never an ordered job's key). Other
  jobs are never gated.

Popped jobs move to **processing** (by job id) until ``done``.

Locks and lock order
--------------------
Three lock domains, always taken in this order, never the reverse:

1. ``_index_lock`` — the job index (buffered id → job), per-shard id sets,
   the delayed index, key holders and wait lists.
2. ``_lanes_lock`` — the lane heaps and the set of non-empty lanes.
3. ``_processing_lock`` — processing jobs by id.

``push``/``pop``/``drop_shard``/``drain`` take 1, then 2 and/or 3 nested.
``done`` takes 3 alone, releases it, and only then (for a gated job) takes
1 → 2 to pass the key on: it never holds 3 while asking for 1. Between the
two steps the key is still held, so no second job of that key can start
early. Read-only properties read a ``len()`` without locks (atomic under the
GIL; ``free`` is a snapshot, not a reservation).

Capacity check: ``push`` counts processing under lock 3 nested in lock 1;
processing only grows inside lock 1 (``pop``), so a concurrent ``done`` can
only make the check conservative, never overfill.

No clock is read: every time-dependent call takes ``now`` (seconds, the same
clock as ``run_after``).
"""

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count
from threading import Lock
from typing import TypedDict

from .fairlane import FairLane
from .hashing import fnv1a_32
from .heap import Entry, FastestIndexedQueue, make_indexed_queue
from .skiplist import DelayedIndex, make_delayed_index

__all__ = ["DuplicateJob", "LocalQueue", "QueueFull", "QueueSnapshot", "QueuedJob"]


class QueueFull(Exception):
    """The local queue holds ``capacity`` jobs (buffered + processing)."""


class DuplicateJob(ValueError):
    """A job with this id is already buffered or processing here."""


# A run_after that is no finite number (a row written by hand: the claim
# quarantines such rows, this guards the structure behind it) is due now: an
# infinity would sit in the delayed index for good, holding a slot of the
# capacity, and NaN compares false to every key of a lane's heap. The test is
# written so that NaN fails it too.
_INF = float("inf")


@dataclass(slots=True)
class QueuedJob:
    """A claimed job as the local queue sees it."""

    id: int
    queue_name: str
    priority: int
    run_after: float
    shard: int
    key: str | None = None
    ordered: bool = False
    payload: object = None
    # Holders its key may have at once (0: not capped); ordered allows one.
    cap: int = 0
    # Fair share inside its queue (docs/fairness.md; shardq.core.fairlane):
    # its fair key (None: none, and nothing of fairness applies), its
    # weight, whether its share counts measured run time, and what its pop
    # charged its key.
    fair_key: str | None = None
    fair_weight: float = 1.0
    fair_by_time: bool = False
    charged: float = 0.0

    @property
    def gated(self) -> bool:
        return self.key is not None and (self.ordered or self.cap > 0)


class QueueSnapshot(TypedDict):
    """What :meth:`LocalQueue.snapshot` returns: jobs per place."""

    buffered: int
    delayed: int
    waiting: int
    lanes: list[int]
    processing: int


class LocalQueue:
    """Bounded, thread-safe, lane-partitioned priority queue of claimed jobs."""

    __slots__ = (
        "_active",
        "_by_shard",
        "_capacity",
        "_delayed",
        "_fair_active",
        "_fair_buffered",
        "_fair_crowded",
        "_fair_estimate",
        "_fair_lanes",
        "_fair_timed",
        "_fair_weight_of",
        "_held_back",
        "_holders",
        "_index_lock",
        "_jobs",
        "_lane_of",
        "_lanes",
        "_lanes_lock",
        "_mask",
        "_processing",
        "_processing_lock",
        "_seq",
        "_waiting",
    )

    def __init__(self, lane_count: int, capacity: int) -> None:
        if lane_count < 1 or lane_count & (lane_count - 1):
            raise ValueError(f"lane_count must be a power of two ≥ 1, got {lane_count!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity!r}")
        self._capacity = capacity
        self._mask = lane_count - 1
        self._seq = count()
        self._lanes: list[FastestIndexedQueue[int, QueuedJob]] = [
            make_indexed_queue(self._seq) for _ in range(lane_count)
        ]
        self._active: dict[int, FastestIndexedQueue[int, QueuedJob]] = {}  # lane index -> lane, non-empty only
        self._lane_of: dict[str, int] = {}  # queue name -> lane index (memo of the FNV-1a)
        self._jobs: dict[int, QueuedJob] = {}  # buffered job id -> job (lanes, delayed, waiting)
        self._by_shard: dict[int, set[int]] = {}  # shard -> set of buffered job ids
        # Sized by capacity: the delayed index never holds more than that.
        self._delayed: DelayedIndex[int, QueuedJob] = make_delayed_index(capacity)
        self._holders: dict[str, set[int]] = {}  # gated key -> ids of its jobs in a lane or processing
        # gated key -> OrderedDict(id -> job) not yet admitted
        self._waiting: dict[str, OrderedDict[int, QueuedJob]] = {}
        # Capped (not ordered) jobs waiting at their key's gate: see held_back.
        self._held_back = 0
        self._processing: dict[int, QueuedJob] = {}  # job id -> job
        # Fairness (docs/fairness.md): each lane's flows, made when its
        # first fair job comes (lane index -> FairLane), the lanes whose
        # flows have jobs, and buffered jobs per fair key (the claim passes
        # over a key with its share buffered: full_fair_keys).
        self._fair_lanes: dict[int, FairLane[QueuedJob]] = {}
        self._fair_active: dict[int, FairLane[QueuedJob]] = {}
        self._fair_buffered: dict[str, int] = {}
        self._fair_crowded = 0  # fair keys with two jobs or more buffered
        # Of the buffered fair keys: the last weight seen, those fair by
        # time, and (any key seen) its run time estimate, for their shares.
        self._fair_weight_of: dict[str, float] = {}
        self._fair_timed: set[str] = set()
        self._fair_estimate: dict[str, float] = {}
        self._index_lock = Lock()
        self._lanes_lock = Lock()
        self._processing_lock = Lock()

    # -- sizes -----------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def lane_count(self) -> int:
        return self._mask + 1

    @property
    def buffered(self) -> int:
        """Jobs held and not yet handed out (ready, delayed or key-waiting)."""
        return len(self._jobs)

    @property
    def processing(self) -> int:
        """Jobs handed out by ``pop`` and not yet ``done``."""
        return len(self._processing)

    @property
    def held_back(self) -> int:
        """Capped jobs waiting at their key's gate (buffered, not ready to
        run however many threads are idle): the fetcher's demand leaves them
        out, so a key at its cap does not stop the claim of other jobs."""
        return self._held_back

    def full_keys(self) -> list[str]:
        """The capped keys with jobs waiting at their gate (the claim passes
        over their jobs until the gate opens), a snapshot."""
        with self._index_lock:
            return [key for key, waiting in self._waiting.items() if next(iter(waiting.values())).cap]

    def full_fair_keys(self, room: int) -> dict[str, int]:
        """The fair keys buffered to their share of ``room`` jobs -> that
        share (the claim passes over them until they run down), a snapshot.

        A key's share is ``room`` times its weight over the weights of the
        keys buffered here; for a key fair by time, scaled by the mean run
        time estimate of such keys over its own, so its share holds as much
        work, not as many jobs, as another's: a key whose jobs run fast is
        not left dry between claims while a slow one fills the room."""
        if not self._fair_buffered:
            return {}
        # Lock 1: the counts change under it (a pop, a push, a lost shard).
        with self._index_lock:
            counts = dict(self._fair_buffered)
            weights = dict(self._fair_weight_of)
            timed_keys = set(self._fair_timed)
        total = sum(weights.get(key, 1.0) for key in counts)
        timed = {key: self._fair_estimate.get(key, 0.0) for key in counts if key in timed_keys}
        known = [e for e in timed.values() if e > 0.0]
        mean = sum(known) / len(known) if known else 0.0
        full = {}
        for key, n in counts.items():
            share = room * weights.get(key, 1.0) / total
            estimate = timed.get(key, 0.0)
            if estimate > 0.0:
                share *= mean / estimate
            # At least 2: a key with one job here is never full (with as many
            # keys as jobs, none is, and the claim takes a FIFO slice).
            share_jobs = max(2, int(share))
            if n >= share_jobs:
                full[key] = share_jobs
        return full

    @property
    def fair_crowded(self) -> bool:
        """Has some fair key two jobs or more buffered (a snapshot)? With
        none, the claim takes a FIFO slice of the fair jobs."""
        return self._fair_crowded > 0

    @property
    def has_fair(self) -> bool:
        """Are jobs with a fair key buffered (a snapshot)?"""
        return bool(self._fair_buffered)

    def fair_backlog_of(self, key: str) -> int:
        """Buffered jobs of one fair key (a snapshot)."""
        return self._fair_buffered.get(key, 0)

    def fair_backlog(self) -> dict[str, int]:
        """Buffered jobs per fair key (a snapshot, for the operator's view)."""
        with self._index_lock:
            return dict(self._fair_buffered)

    @property
    def free(self) -> int:
        """``capacity - buffered - processing``: how many jobs to fetch."""
        return self._capacity - len(self._jobs) - len(self._processing)

    def lane_for(self, queue_name: str) -> int:
        """The lane a queue's jobs go to."""
        lane = self._lane_of.get(queue_name)
        if lane is None:
            lane = self._lane_of[queue_name] = fnv1a_32(queue_name) & self._mask
        return lane

    # -- push / pop / done -----------------------------------------------------
    def push(self, job: QueuedJob, now: float) -> None:
        """Buffer a claimed job. Raises QueueFull or DuplicateJob."""
        job_id = job.id
        jobs = self._jobs
        with self._index_lock:
            if job_id in jobs:
                raise DuplicateJob(f"job {job_id} is already buffered")
            with self._processing_lock:
                if job_id in self._processing:
                    raise DuplicateJob(f"job {job_id} is already processing")
                held = len(jobs) + len(self._processing)
            if held >= self._capacity:
                raise QueueFull(f"local queue is full ({held} of {self._capacity}); fetch only `free` jobs")
            jobs[job_id] = job
            ids = self._by_shard.get(job.shard)
            if ids is None:
                ids = self._by_shard[job.shard] = set()
            ids.add(job_id)
            if job.fair_key is not None:
                self._count_fair(job.fair_key, 1, job)
            if not -_INF < job.run_after < _INF:
                job.run_after = now  # see _INF
            if job.run_after > now:
                self._delayed.add(job_id, job.run_after, job)
            elif job.gated:
                self._admit_gated(job)
            else:
                self._to_lane(job)

    def push_many(self, jobs: list[QueuedJob], now: float) -> list[QueuedJob]:
        """``push`` each of ``jobs`` in order, with one round of the locks for
        the batch (a claim's hundreds of jobs took three lock rounds each);
        returns the jobs ``push`` would have refused (DuplicateJob or
        QueueFull), in order.

        Processing is read once, under lock 3 nested in lock 1: it only
        grows inside lock 1, so what it holds can only shrink meanwhile and
        the checks stay conservative, as ``push``'s are. Ungated jobs due
        now go to their lanes together under lock 2, flushed before a
        gated job is admitted, so lane sequence numbers follow the order
        of ``jobs`` exactly as single pushes would."""
        refused: list[QueuedJob] = []
        buffered = self._jobs
        by_shard = self._by_shard
        capacity = self._capacity
        to_lanes: list[QueuedJob] = []
        with self._index_lock:
            with self._processing_lock:
                processing = self._processing
                held_elsewhere = {job.id for job in jobs if job.id in processing}
                processing_count = len(processing)
            for job in jobs:
                job_id = job.id
                if job_id in buffered or job_id in held_elsewhere or len(buffered) + processing_count >= capacity:
                    refused.append(job)
                    continue
                buffered[job_id] = job
                ids = by_shard.get(job.shard)
                if ids is None:
                    ids = by_shard[job.shard] = set()
                ids.add(job_id)
                if job.fair_key is not None:
                    self._count_fair(job.fair_key, 1, job)
                if not -_INF < job.run_after < _INF:
                    job.run_after = now  # see _INF
                if job.run_after > now:
                    self._delayed.add(job_id, job.run_after, job)
                elif job.gated:
                    if to_lanes:
                        self._to_lanes(to_lanes)
                        to_lanes = []
                    self._admit_gated(job)
                else:
                    to_lanes.append(job)
            if to_lanes:
                self._to_lanes(to_lanes)
        return refused

    def _to_lanes(self, jobs: list[QueuedJob]) -> None:
        """``_to_lane`` for each of ``jobs``, in order, under one round of lock 2."""
        lane_of, lanes, active = self._lane_of, self._lanes, self._active
        with self._lanes_lock:
            for job in jobs:
                index = lane_of.get(job.queue_name)
                if index is None:
                    index = self.lane_for(job.queue_name)
                if job.fair_key is not None:
                    self._to_fair_lane(index, job)
                    continue
                lane = lanes[index]
                lane.push(job.id, job.priority, job.run_after, job)
                active[index] = lane

    def pop(self, now: float, min_priority: int | None = None) -> QueuedJob | None:
        """Hand out the best ready job (moving it to processing), or None.

        With ``min_priority``: None as well when the best ready job is below
        it. ``pop_many`` of one (an executor thread takes its next job so)."""
        jobs = self.pop_many(now, 1, min_priority)
        return jobs[0] if jobs else None

    def pop_many(self, now: float, limit: int, min_priority: int | None = None) -> list[QueuedJob]:
        """Up to ``limit`` jobs, best first, as that many ``pop`` calls would
        hand them out, with one round of the locks.

        A popped job is put in processing before it leaves the buffered
        index, so a lockless ``job_id in queue`` never misses it."""
        out: list[QueuedJob] = []
        with self._index_lock:
            delayed = self._delayed
            if delayed:
                due_at = delayed.next_time()
                if due_at is not None and due_at <= now:
                    self._promote(delayed.pop_due(now))
            with self._lanes_lock:
                active = self._active
                if self._fair_active:
                    self._pop_fair(out, limit, min_priority)
                while active and len(out) < limit:
                    if len(active) == 1:
                        index, lane = next(iter(active.items()))
                    else:
                        best: Entry[int, QueuedJob] | None = None
                        index = -1
                        for candidate, candidate_lane in active.items():
                            head = candidate_lane.peek()
                            assert head is not None  # an active lane is never empty
                            if best is None or head < best:
                                best, index = head, candidate
                        lane = active[index]
                    if min_priority is not None:
                        head = lane.peek()
                        assert head is not None
                        if -head[0] < min_priority:  # an entry starts with -priority
                            break
                    out.append(lane.pop())
                    if not lane:
                        del active[index]
            if out:
                with self._processing_lock:
                    processing = self._processing
                    for job in out:
                        processing[job.id] = job
                buffered, by_shard = self._jobs, self._by_shard
                for job in out:
                    job_id = job.id
                    if job.fair_key is not None:
                        self._count_fair(job.fair_key, -1)
                    del buffered[job_id]
                    ids = by_shard[job.shard]
                    ids.discard(job_id)
                    if not ids:
                        del by_shard[job.shard]
        return out

    def done(self, job_id: int, ran_seconds: float | None = None) -> None:
        """The job finished (any outcome): forget it and release its key.
        ``ran_seconds``: how long its task ran, charged to its fair key
        when its share counts time (docs/fairness.md; None: not measured,
        the estimate charged at its pop stands)."""
        with self._processing_lock:
            job = self._processing.pop(job_id, None)
        if job is None:
            raise KeyError(f"job {job_id} is not processing in this local queue")
        if job.fair_by_time and job.fair_key is not None and ran_seconds is not None:
            fair_key = job.fair_key
            estimate = self._fair_estimate.get(fair_key)
            if ran_seconds >= 0.0:
                # A float store under the GIL: read as a snapshot by full_fair_keys.
                self._fair_estimate[fair_key] = (
                    ran_seconds if estimate is None else estimate + 0.2 * (ran_seconds - estimate)
                )
                if len(self._fair_estimate) > 65536:
                    self._fair_estimate.clear()
            # Lock 3 is released: lock 2 alone (never 1 after it).
            with self._lanes_lock:
                fair = self._fair_lanes.get(self.lane_for(job.queue_name))
                if fair is not None:
                    fair.charge(job, ran_seconds)
        key = job.key
        if key is not None and job.gated:
            # Lock 3 is released: taking 1 now keeps the lock order.
            with self._index_lock:
                self._release_key(key, job_id)

    # -- bulk removal ----------------------------------------------------------
    def drop_shard(self, shard: int) -> list[QueuedJob]:
        """Remove and return every buffered job of ``shard`` (a lost lease).

        Runs in time proportional to that shard's buffered jobs. Processing
        jobs are untouched. Returned in id order.
        """
        with self._index_lock:
            ids = self._by_shard.pop(shard, None)
            if not ids:
                return []
            jobs = self._jobs
            out = []
            for job_id in sorted(ids):
                job = jobs.pop(job_id)
                if job.fair_key is not None:
                    self._count_fair(job.fair_key, -1)
                self._unlink(job)
                out.append(job)
            return out

    def drop_queues(self, queues: "set[str] | frozenset[str]") -> list[QueuedJob]:
        """Remove and return every buffered job of these queues (a queue
        paused by an operator), in id order. Processing jobs are untouched.
        Walks every buffered job: a pause is rare."""
        with self._index_lock:
            jobs = self._jobs
            out = sorted((job for job in jobs.values() if job.queue_name in queues), key=_job_id)
            for job in out:
                del jobs[job.id]
                ids = self._by_shard[job.shard]
                ids.discard(job.id)
                if not ids:
                    del self._by_shard[job.shard]
                if job.fair_key is not None:
                    self._count_fair(job.fair_key, -1)
                self._unlink(job)
            return out

    def count_by_queue(self) -> dict[str, int]:
        """Jobs here (buffered or processing) by queue name: a snapshot
        (each dict copied in one C call under the GIL)."""
        counts: dict[str, int] = {}
        for job in [*self._jobs.values(), *self._processing.values()]:
            counts[job.queue_name] = counts.get(job.queue_name, 0) + 1
        return counts

    def __contains__(self, job_id: int) -> bool:
        """Is the job buffered or processing here? (Two dict lookups, no lock:
        a snapshot, like the sizes.)"""
        return job_id in self._jobs or job_id in self._processing

    def drain(self) -> list[QueuedJob]:
        """Remove and return every buffered job (shutdown), in id order."""
        with self._index_lock:
            out = sorted(self._jobs.values(), key=_job_id)
            self._jobs.clear()
            self._by_shard.clear()
            self._delayed.clear()
            self._waiting.clear()
            self._held_back = 0
            self._fair_buffered.clear()
            self._fair_crowded = 0
            self._fair_weight_of.clear()
            self._fair_timed.clear()
            with self._lanes_lock:
                for lane in self._lanes:
                    lane.clear()
                self._active.clear()
                for fair in self._fair_lanes.values():
                    fair.clear()
                self._fair_active.clear()
            with self._processing_lock:
                processing = self._processing
                # Only keys held by a processing job stay held, by those jobs.
                holders = {key: ids & processing.keys() for key, ids in self._holders.items()}
                self._holders = {key: ids for key, ids in holders.items() if ids}
            return out

    def next_due(self) -> float | None:
        """Earliest ``run_after`` among delayed jobs, or None."""
        with self._index_lock:
            return self._delayed.next_time()

    def snapshot(self) -> QueueSnapshot:
        """Counts per place, for metrics and tests (takes the locks)."""
        with self._index_lock:
            with self._lanes_lock:
                lanes = [len(lane) for lane in self._lanes]
                for index, fair in self._fair_active.items():
                    lanes[index] += len(fair)
            return {
                "buffered": len(self._jobs),
                "delayed": len(self._delayed),
                "waiting": sum(len(w) for w in self._waiting.values()),
                "lanes": lanes,
                "processing": len(self._processing),
            }

    # -- internals: callers hold _index_lock -----------------------------------
    def _to_lane(self, job: QueuedJob) -> None:
        index = self._lane_of.get(job.queue_name)
        if index is None:
            index = self.lane_for(job.queue_name)
        with self._lanes_lock:
            if job.fair_key is not None:
                self._to_fair_lane(index, job)
                return
            lane = self._lanes[index]
            lane.push(job.id, job.priority, job.run_after, job)
            self._active[index] = lane

    def _admit_gated(self, job: QueuedJob) -> None:
        """Admit a gated job to its lane, or make it wait at its key's gate."""
        key = job.key
        assert key is not None  # only gated jobs come here
        holders = self._holders.get(key)
        if holders is None:
            self._holders[key] = {job.id}
            self._to_lane(job)
            return
        waiting = self._waiting.get(key)
        if waiting is None and len(holders) < _allowed(job):
            holders.add(job.id)
            self._to_lane(job)
            return
        # Behind the key's holders, and behind any job already waiting (FIFO).
        if waiting is None:
            waiting = self._waiting[key] = OrderedDict()
        waiting[job.id] = job
        if not job.ordered:
            self._held_back += 1

    def _to_fair_lane(self, index: int, job: QueuedJob) -> None:
        """A fair job into its lane's flows (caller holds lock 2)."""
        fair = self._fair_lanes.get(index)
        if fair is None:
            fair = self._fair_lanes[index] = FairLane(self._seq)
        fair.push(job)
        self._fair_active[index] = fair

    def _count_fair(self, key: str, delta: int, job: QueuedJob | None = None) -> None:
        before = self._fair_buffered.get(key, 0)
        left = before + delta
        self._fair_crowded += (left >= 2) - (before >= 2)
        if job is not None:
            self._fair_weight_of[key] = job.fair_weight
            if job.fair_by_time:
                self._fair_timed.add(key)
        if left > 0:
            self._fair_buffered[key] = left
        else:
            self._fair_buffered.pop(key, None)
            self._fair_weight_of.pop(key, None)
            self._fair_timed.discard(key)

    def _pop_fair(self, out: list[QueuedJob], limit: int, min_priority: int | None) -> None:
        """``pop_many``'s loop while some lane has fair jobs (caller holds
        locks 1 and 2): the best head over the lanes as before, where a
        lane's head is its FairLane's choice between its flows and its
        unkeyed jobs (shardq.core.fairlane)."""
        active, fair_active = self._active, self._fair_active
        while (active or fair_active) and len(out) < limit:
            best: Entry[int, QueuedJob] | None = None
            best_index, best_plain = -1, True
            for index in active.keys() | fair_active.keys():
                fair = fair_active.get(index)
                if fair is None:
                    head = active[index].peek()
                    assert head is not None
                    plain = True
                else:
                    choice = fair.choose(active.get(index))
                    assert choice is not None
                    head, plain = choice
                if best is None or head < best:
                    best, best_index, best_plain = head, index, plain
            assert best is not None
            if min_priority is not None and -best[0] < min_priority:
                return
            fair = fair_active.get(best_index)
            if best_plain:
                lane = active[best_index]
                job = lane.pop()
                if not lane:
                    del active[best_index]
                if fair is not None:
                    fair.served_plain()
            else:
                assert fair is not None
                job = fair.pop()
                if not fair:
                    del fair_active[best_index]
            out.append(job)

    def _promote(self, due: list[QueuedJob]) -> None:
        for job in due:
            if job.gated:
                self._admit_gated(job)
            else:
                self._to_lane(job)

    def _release_key(self, key: str, job_id: int) -> None:
        holders = self._holders.get(key)
        if holders is None or job_id not in holders:
            return
        holders.discard(job_id)
        waiting = self._waiting.get(key)
        # Admit waiting jobs, oldest first, while the key has room for the
        # next (its cap is the next job's: a deploy may have changed it).
        while waiting:
            nxt = next(iter(waiting.values()))
            if len(holders) >= _allowed(nxt):
                break
            del waiting[nxt.id]
            if not nxt.ordered:
                self._held_back -= 1
            holders.add(nxt.id)
            self._to_lane(nxt)
        if waiting is not None and not waiting:
            del self._waiting[key]
        if not holders:
            del self._holders[key]

    def _unlink(self, job: QueuedJob) -> None:
        """Take a buffered job (already out of _jobs/_by_shard) out of its place."""
        job_id = job.id
        if self._delayed.remove(job_id):
            return
        key = job.key
        gated = job.gated
        if gated:
            assert key is not None
            waiting = self._waiting.get(key)
            if waiting is not None and job_id in waiting:
                del waiting[job_id]
                if not job.ordered:
                    self._held_back -= 1
                if not waiting:
                    del self._waiting[key]
                return
        index = self.lane_for(job.queue_name)
        with self._lanes_lock:
            if job.fair_key is not None:
                fair = self._fair_lanes.get(index)
                if fair is not None:
                    fair.remove(job)
                    if not fair:
                        self._fair_active.pop(index, None)
            else:
                lane = self._lanes[index]
                lane.remove(job_id)
                if not lane:
                    self._active.pop(index, None)
        if gated:
            assert key is not None
            self._release_key(key, job_id)


def _job_id(job: QueuedJob) -> int:
    return job.id


def _allowed(job: QueuedJob) -> int:
    """How many holders a gated job's key may have with it admitted."""
    return 1 if job.ordered else job.cap
