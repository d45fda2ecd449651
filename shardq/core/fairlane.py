"""Fair share between the fair keys of one lane of the local queue (docs/fairness.md).

Within a lane, jobs of equal priority are handed out in weighted fair
order across their fair keys; priority still comes first. Each fair key
with jobs in the lane is a *flow*: its own indexed priority queue (the
lane's order: priority, run_after, sequence). Flows take turns by virtual
time, start-time fair queueing, the heap form of weighted deficit round
robin (it gives each backlogged key the same long-run share, weight over
the sum of the backlogged keys' weights, in O(log keys) a pop instead of
a scan of the round):

* the lane keeps a virtual clock ``vtime``; a flow that becomes backlogged
  starts at ``max(vtime, its last finish)``, so a key that was idle gets no
  credit for its idleness and a key that was served is not served again
  before the others caught up;
* the flow with the lowest start (among those whose head has the highest
  priority) is served; its job is charged ``cost / weight``: 1 (fair by
  count) or its key's measured run time (fair by time, estimated at the pop
  and corrected with the measured time when the job is done, ``charge``),
  and the flow's next start is its finish;
* jobs without a fair key in a lane that also holds fair ones count as one
  more flow of weight 1 (the *unkeyed* flow): they keep their own order
  and take their turn, and in a lane without fair jobs nothing here runs.

Not thread-safe: the local queue calls it under its lanes lock. Reads no
clock: the times it is given are the caller's.
"""

from collections.abc import Iterator
from typing import Protocol

from .heap import Entry, FastestIndexedQueue, make_indexed_queue

__all__ = ["FairJob", "FairLane"]

# Share of a new measurement in a key's run time estimate (fair by time).
_ESTIMATE_WEIGHT = 0.2
# A key's run time estimate before any of its jobs was measured: the lane's
# (itself this many seconds before any measurement).
_FIRST_ESTIMATE = 0.01
# Finishes of keys with no job here: looked over past this many, at most
# _FINISH_CAP kept.
_FIRST_PRUNE = 1024
_FINISH_CAP = 65536


class FairJob(Protocol):
    id: int
    priority: int
    run_after: float
    fair_key: str | None
    fair_weight: float
    fair_by_time: bool
    charged: float


class FairLane[J: FairJob]:
    """The flows of one lane (see the module docstring)."""

    __slots__ = (
        "_counter",
        "_estimates",
        "_finish",
        "_flows",
        "_lane_estimate",
        "_order",
        "_prune_at",
        "_start",
        "vtime",
    )

    def __init__(self, counter: Iterator[int]) -> None:
        # The lane's sequence counter: FIFO ties inside a flow break as in the lane.
        self._counter = counter
        self._flows: dict[str, FastestIndexedQueue[int, J]] = {}
        # key -> its flow's start (virtual time), for backlogged keys.
        self._start: dict[str, float] = {}
        # key (None: the unkeyed flow) -> the finish of its last job served.
        self._finish: dict[str | None, float] = {}
        # The flows in turn order: (-head priority, start, sequence, key, key).
        self._order: FastestIndexedQueue[str, str] = make_indexed_queue()
        self._estimates: dict[str, float] = {}
        self._lane_estimate = _FIRST_ESTIMATE
        self._prune_at = _FIRST_PRUNE
        self.vtime = 0.0

    def __bool__(self) -> bool:
        return bool(self._flows)

    def __len__(self) -> int:
        return sum(len(flow) for flow in self._flows.values())

    @property
    def keys(self) -> int:
        """Backlogged fair keys."""
        return len(self._flows)

    def push(self, job: J) -> None:
        key = job.fair_key
        assert key is not None  # only jobs with a fair key come here
        flow = self._flows.get(key)
        if flow is None:
            flow = self._flows[key] = make_indexed_queue(self._counter)
            self._start[key] = max(self.vtime, self._finish.get(key, 0.0))
        flow.push(job.id, job.priority, job.run_after, job)
        head = flow.peek()
        assert head is not None
        if head[3] == job.id:  # a new head: the flow's place in turn changes
            self._order.push(key, -head[0], self._start[key], key)

    def remove(self, job: J) -> bool:
        key = job.fair_key
        assert key is not None
        flow = self._flows.get(key)
        if flow is None or not flow.remove(job.id):
            return False
        if not flow:
            self._forget_flow(key)
        else:
            head = flow.peek()
            assert head is not None
            self._order.push(key, -head[0], self._start[key], key)
        return True

    def clear(self) -> None:
        self._flows.clear()
        self._start.clear()
        self._order.clear()

    def choose(self, plain: FastestIndexedQueue[int, J] | None) -> tuple[Entry[int, J], bool] | None:
        """The job to hand out next between the flows and the lane's unkeyed
        jobs (``plain``, may be empty or None): its entry, and whether it is
        the unkeyed one's. None when both are empty."""
        plain_head = plain.peek() if plain else None
        turn = self._order.peek()
        if turn is None:
            return None if plain_head is None else (plain_head, True)
        flow_head = self._flows[turn[3]].peek()
        assert flow_head is not None
        if plain_head is not None:
            plain_start = max(self.vtime, self._finish.get(None, 0.0))
            if (plain_head[0], plain_start) <= (turn[0], turn[1]):
                return plain_head, True
        return flow_head, False

    def served_plain(self) -> None:
        """An unkeyed job was handed out (``choose`` said so): its flow's turn."""
        start = max(self.vtime, self._finish.get(None, 0.0))
        self._finish[None] = start + 1.0
        self.vtime = start

    def pop(self) -> J:
        """Hand out the job of the flow whose turn it is (``choose`` said
        so), charged to its key."""
        turn = self._order.peek()
        assert turn is not None
        key = turn[3]
        flow = self._flows[key]
        job = flow.pop()
        start = self._start[key]
        cost = self._estimates.get(key, self._lane_estimate) if job.fair_by_time else 1.0
        job.charged = cost
        finish = start + cost / job.fair_weight
        self._finish[key] = finish
        if start > self.vtime:
            self.vtime = start
        if flow:
            self._start[key] = finish
            head = flow.peek()
            assert head is not None
            self._order.push(key, -head[0], finish, key)
        else:
            self._forget_flow(key)
        return job

    def charge(self, job: J, seconds: float) -> None:
        """A job of fair_by="time" ran ``seconds``: correct its key's charge
        (estimated at the pop) and its key's estimate."""
        key = job.fair_key
        if key is None or not job.fair_by_time:
            return
        if not seconds >= 0.0:  # NaN or a clock step back: no correction
            return
        delta = (seconds - job.charged) / job.fair_weight
        job.charged = seconds
        estimate = self._estimates.get(key)
        self._estimates[key] = seconds if estimate is None else estimate + _ESTIMATE_WEIGHT * (seconds - estimate)
        self._lane_estimate += _ESTIMATE_WEIGHT * (seconds - self._lane_estimate)
        if key in self._finish:
            self._finish[key] += delta
        if key in self._start:
            self._start[key] += delta
            head = self._flows[key].peek()
            assert head is not None
            self._order.push(key, -head[0], self._start[key], key)
        if len(self._estimates) > 4 * len(self._flows) + 4096:
            self._estimates = {k: v for k, v in self._estimates.items() if k in self._flows}

    def _forget_flow(self, key: str) -> None:
        del self._flows[key]
        del self._start[key]
        self._order.remove(key)
        finish = self._finish
        # A finish at or below the clock changes nothing (a flow starts at
        # max(vtime, finish)): forget them once they pile up, and past
        # _FINISH_CAP forget the idle keys' finishes (such a key, back, owes
        # at most its last job's charge). The next look waits until the
        # dict doubles: with a key a job, no finish is ever below the clock,
        # and a look at every pop made each pop cost the whole dict (1 ms a
        # job at 20,000 keys, measured).
        if len(finish) > self._prune_at:
            vtime = self.vtime
            kept = {k: f for k, f in finish.items() if f > vtime}
            if len(kept) > _FINISH_CAP:
                flows = self._flows
                kept = {k: f for k, f in kept.items() if k in flows}
            self._finish = kept
            self._prune_at = max(_FIRST_PRUNE, 2 * len(kept))
