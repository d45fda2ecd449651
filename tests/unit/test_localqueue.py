"""LocalQueue against a naive model, plus real-thread checks."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shardq.core.localqueue import DuplicateJob, LocalQueue, QueuedJob, QueueFull

QUEUES = ["default", "emails", "reports", "q3"]
CAPPED_2 = "\0app.tasks.sync\0acme"
CAPPED_3 = "\0app.tasks.sync\0globex"
CAPS = {CAPPED_2: 2, CAPPED_3: 3}
KEY_SHARD = {"a": 0, "b": 1, "c": 1, "d": 3, CAPPED_2: 2, CAPPED_3: 1}  # a key always maps to one shard


def gated(job):
    return job.key is not None and (job.ordered or job.cap > 0)


def allowed(job):
    return 1 if job.ordered else job.cap


class Model:
    """The queue's contract spelled out with lists and linear scans."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.jobs = {}  # buffered id -> job
        self.delayed = []  # ids in push order
        self.lane = {}  # eligible id -> lane sequence
        self.waiting = {}  # key -> [ids] in FIFO order
        self.holder = {}  # key -> ids in a lane or processing (one for ordered, up to cap for capped)
        self.processing = {}
        self.counter = 0

    def _to_lane(self, job):
        self.lane[job.id] = self.counter
        self.counter += 1

    def _ready(self, job):
        if gated(job):
            holders = self.holder.setdefault(job.key, [])
            if job.key in self.waiting or len(holders) >= allowed(job):
                self.waiting.setdefault(job.key, []).append(job.id)
                return
            holders.append(job.id)
        self._to_lane(job)

    def push(self, job, now):
        self.jobs[job.id] = job
        if job.run_after > now:
            self.delayed.append(job.id)
        else:
            self._ready(job)

    def pop(self, now, min_priority=None):
        due = [i for i in self.delayed if self.jobs[i].run_after <= now]
        due.sort(key=lambda i: (self.jobs[i].run_after, self.delayed.index(i)))
        self.delayed = [i for i in self.delayed if i not in due]
        for i in due:
            self._ready(self.jobs[i])
        if not self.lane:
            return None
        best = min(self.lane, key=lambda i: (-self.jobs[i].priority, self.jobs[i].run_after, self.lane[i]))
        if min_priority is not None and self.jobs[best].priority < min_priority:
            return None
        del self.lane[best]
        job = self.jobs.pop(best)
        self.processing[best] = job
        return job

    def _release(self, key, job_id):
        holders = self.holder.get(key, [])
        if job_id not in holders:
            return
        holders.remove(job_id)
        queue = self.waiting.get(key, [])
        while queue and len(holders) < allowed(self.jobs[queue[0]]):
            nxt = queue.pop(0)
            holders.append(nxt)
            self._to_lane(self.jobs[nxt])
        if key in self.waiting and not queue:
            del self.waiting[key]
        if not holders:
            del self.holder[key]

    def done(self, job_id):
        job = self.processing.pop(job_id)
        if gated(job):
            self._release(job.key, job_id)

    def _unlink(self, job):
        if job.id in self.delayed:
            self.delayed.remove(job.id)
            return
        if gated(job) and job.id in self.waiting.get(job.key, []):
            self.waiting[job.key].remove(job.id)
            if not self.waiting[job.key]:
                del self.waiting[job.key]
            return
        del self.lane[job.id]
        if gated(job):
            self._release(job.key, job.id)

    def drop_shard(self, shard):
        out = []
        for i in sorted(i for i, j in self.jobs.items() if j.shard == shard):
            job = self.jobs.pop(i)
            self._unlink(job)
            out.append(job)
        return out

    def drain(self):
        out = sorted(self.jobs.values(), key=lambda j: j.id)
        self.jobs.clear()
        self.delayed.clear()
        self.lane.clear()
        self.waiting.clear()
        holders = {k: [i for i in ids if i in self.processing] for k, ids in self.holder.items()}
        self.holder = {k: ids for k, ids in holders.items() if ids}
        return out


class LocalQueueMachine(RuleBasedStateMachine):
    @initialize(lanes=st.sampled_from([1, 2, 4, 64]), capacity=st.sampled_from([3, 8, 30]))
    def start(self, lanes, capacity):
        self.q = LocalQueue(lanes, capacity)
        self.model = Model(capacity)
        self.now = 100.0
        self.next_id = 1

    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.sampled_from([-5, 0, 0, 5]),
        delay=st.sampled_from([-1.0, 0.0, 0.0, 0.0, 0.5, 2.0]),
        key=st.sampled_from([None, "a", "b", "c", "d", CAPPED_2, CAPPED_2, CAPPED_2, CAPPED_3, CAPPED_3]),
        ordered=st.booleans(),
        free_shard=st.integers(min_value=0, max_value=3),
        redeployed=st.sampled_from([False, False, False, True]),
    )
    def push(self, queue, priority, delay, key, ordered, free_shard, redeployed):
        # A capped key (a limit by the shard key: the worker writes it as
        # NUL + task + NUL + key) is never an ordered job's; its cap is the
        # task's, which a deploy may change between two jobs of the key.
        cap = 0
        if key in CAPS:
            ordered, cap = False, CAPS[key] + (1 if redeployed else 0)
        job = QueuedJob(
            id=self.next_id,
            queue_name=queue,
            priority=priority,
            run_after=self.now + delay,
            shard=KEY_SHARD[key] if key else free_shard,
            key=key,
            ordered=ordered,
            cap=cap,
        )
        if len(self.model.jobs) + len(self.model.processing) >= self.model.capacity:
            with pytest.raises(QueueFull):
                self.q.push(job, self.now)
            return
        self.next_id += 1
        self.q.push(job, self.now)
        self.model.push(job, self.now)

    @rule(
        key=st.sampled_from(sorted(CAPS)),
        extra=st.integers(min_value=0, max_value=2),
        delay=st.sampled_from([0.0, 0.0, 0.5]),
    )
    def push_a_capped_burst(self, key, extra, delay):
        """More jobs of one capped key at once than its cap: some must wait;
        a delayed one that falls due waits too."""
        for _ in range(CAPS[key] + extra):
            job = QueuedJob(self.next_id, "default", 0, self.now + delay, KEY_SHARD[key], key, cap=CAPS[key])
            if len(self.model.jobs) + len(self.model.processing) >= self.model.capacity:
                with pytest.raises(QueueFull):
                    self.q.push(job, self.now)
                return
            self.next_id += 1
            self.q.push(job, self.now)
            self.model.push(job, self.now)

    @precondition(lambda self: self.model.jobs or self.model.processing)
    @rule(data=st.data())
    def push_of_a_held_id_is_refused(self, data):
        held = sorted(set(self.model.jobs) | set(self.model.processing))
        job_id = data.draw(st.sampled_from(held))
        with pytest.raises(DuplicateJob):
            self.q.push(QueuedJob(job_id, "default", 0, self.now, 0), self.now)

    @rule(dt=st.sampled_from([0.0, 0.3, 1.0]))
    def advance_time(self, dt):
        self.now += dt

    @rule()
    def pop_hands_out_the_model_choice(self):
        expected = self.model.pop(self.now)
        assert self.q.pop(self.now) == expected

    @rule(min_priority=st.sampled_from([-5, 0, 1, 5, 6]))
    def pop_with_a_floor_hands_out_the_model_choice_only_at_or_above_it(self, min_priority):
        expected = self.model.pop(self.now, min_priority)
        assert self.q.pop(self.now, min_priority) == expected

    @precondition(lambda self: self.model.processing)
    @rule(data=st.data())
    def done_releases(self, data):
        job_id = data.draw(st.sampled_from(sorted(self.model.processing)))
        self.q.done(job_id)
        self.model.done(job_id)

    @rule(shard=st.integers(min_value=0, max_value=4))
    def drop_shard_removes_exactly_that_shards_buffered_jobs(self, shard):
        dropped = self.q.drop_shard(shard)
        assert dropped == self.model.drop_shard(shard)
        assert all(j.shard == shard for j in dropped)

    @rule()
    def drain_returns_every_buffered_job(self):
        assert self.q.drain() == self.model.drain()

    @invariant()
    def counts_agree(self):
        q, m = self.q, self.model
        assert q.buffered == len(m.jobs)
        assert q.processing == len(m.processing)
        assert q.free == m.capacity - len(m.jobs) - len(m.processing) >= 0
        snap = q.snapshot()
        assert snap["delayed"] == len(m.delayed)
        assert snap["waiting"] == sum(len(v) for v in m.waiting.values())
        held_back = [i for ids in m.waiting.values() for i in ids if m.jobs[i].cap and not m.jobs[i].ordered]
        assert q.held_back == len(held_back)
        assert sorted(q.full_keys()) == sorted({m.jobs[i].key for i in held_back})
        assert sum(snap["lanes"]) == len(m.lane)

    @invariant()
    def next_due_is_the_earliest_delayed_time(self):
        times = [self.model.jobs[i].run_after for i in self.model.delayed]
        assert self.q.next_due() == (min(times) if times else None)

    @invariant()
    def an_ordered_key_has_at_most_one_job_processing(self):
        keys = [j.key for j in self.model.processing.values() if j.ordered and j.key]
        assert len(keys) == len(set(keys))

    @invariant()
    def a_capped_key_has_at_most_its_cap_processing(self):
        for key, base in CAPS.items():
            running = [j for j in self.q._processing.values() if j.key == key]
            assert len(running) <= base + 1  # the cap, or a redeployed job's cap one higher


TestLocalQueueAgainstModel = LocalQueueMachine.TestCase
TestLocalQueueAgainstModel.settings = settings(max_examples=120, stateful_step_count=80, deadline=None)


def job(job_id, queue="default", priority=0, run_after=0.0, shard=0, key=None, ordered=False):
    return QueuedJob(job_id, queue, priority, run_after, shard, key, ordered)


def test_pop_takes_the_best_job_across_lanes():
    q = LocalQueue(4, 10)
    names = ["default", "emails", "reports", "bulk"]
    assert len({q.lane_for(n) for n in names}) > 1
    for i, name in enumerate(names):
        q.push(job(i, name, priority=i), 0.0)
    assert [q.pop(0.0).id for _ in range(4)] == [3, 2, 1, 0]
    assert q.pop(0.0) is None


def test_pop_with_a_floor_hands_out_only_jobs_at_or_above_it_best_first():
    q = LocalQueue(4, 10)
    for i, (name, priority) in enumerate([("default", 0), ("emails", 100), ("reports", 5), ("default", 5)]):
        q.push(job(i, name, priority=priority), 0.0)
    assert q.pop(0.0, min_priority=101) is None
    assert [q.pop(0.0, min_priority=1).id for _ in range(3)] == [1, 2, 3]
    assert q.pop(0.0, min_priority=1) is None  # only the priority-0 job is left, and stays
    assert q.buffered == 1 and q.pop(0.0).id == 0


def test_pop_with_a_floor_in_one_lane_leaves_a_lower_head_alone():
    q = LocalQueue(1, 10)
    q.push(job(1, priority=3), 0.0)
    assert q.pop(0.0, min_priority=4) is None
    assert q.pop(0.0, min_priority=3).id == 1


def test_a_keys_next_ordered_job_waits_until_the_previous_is_done():
    q = LocalQueue(2, 10)
    q.push(job(1, key="k", ordered=True), 0.0)
    q.push(job(2, key="k", ordered=True, priority=50), 0.0)
    q.push(job(3), 0.0)
    assert q.pop(0.0).id == 1
    assert q.pop(0.0).id == 3  # job 2 outranks 3 but its key is busy
    assert q.pop(0.0) is None
    q.done(1)
    assert q.pop(0.0).id == 2


def test_a_capped_key_runs_up_to_its_cap_and_admits_the_next_in_order_as_one_ends():
    q = LocalQueue(2, 20)
    for i in range(1, 6):
        q.push(QueuedJob(i, "default", 0, 0.0, 0, CAPPED_2, cap=2), 0.0)
    q.push(QueuedJob(6, "default", 0, 0.0, 1, CAPPED_3, cap=3), 0.0)
    q.push(job(7, priority=-1), 0.0)
    assert q.snapshot()["waiting"] == 3  # jobs 3, 4, 5 behind the key's two holders
    assert [j.id for j in q.pop_many(0.0, 10)] == [1, 2, 6, 7]
    assert q.pop(0.0) is None
    q.done(2)
    assert q.pop(0.0).id == 3  # the oldest waiting one
    assert q.pop(0.0) is None  # 1 and 3 run: the key is full again
    q.done(1)
    q.done(3)
    assert [j.id for j in q.pop_many(0.0, 10)] == [4, 5]


def test_a_capped_key_waiting_job_keeps_its_turn_when_a_holder_is_dropped_with_its_shard():
    q = LocalQueue(1, 20)
    q.push(QueuedJob(1, "default", 0, 0.0, 5, CAPPED_2, cap=1), 0.0)  # a holder in a lane, shard 5
    q.push(QueuedJob(2, "default", 0, 0.0, 6, CAPPED_2, cap=1), 0.0)  # waits behind it
    assert [j.id for j in q.drop_shard(5)] == [1]
    assert q.pop(0.0).id == 2
    q.push(QueuedJob(3, "default", 0, 0.0, 6, CAPPED_2, cap=1), 0.0)
    assert q.drain() == [QueuedJob(3, "default", 0, 0.0, 6, CAPPED_2, cap=1)]
    q.push(QueuedJob(4, "default", 0, 0.0, 6, CAPPED_2, cap=1), 0.0)
    assert q.pop(0.0) is None  # job 2 still runs and still holds the key after the drain
    q.done(2)
    assert q.pop(0.0).id == 4


def test_unordered_jobs_with_a_key_are_not_gated():
    q = LocalQueue(2, 10)
    q.push(job(1, key="k"), 0.0)
    q.push(job(2, key="k"), 0.0)
    assert [q.pop(0.0).id, q.pop(0.0).id] == [1, 2]


def test_delayed_jobs_move_to_their_lane_when_due():
    q = LocalQueue(2, 10)
    q.push(job(1, run_after=5.0, priority=100), 0.0)
    q.push(job(2, run_after=3.0), 0.0)
    assert q.next_due() == 3.0
    assert q.pop(2.9) is None
    assert q.pop(5.0).id == 1
    assert q.pop(5.0).id == 2
    assert q.next_due() is None


def test_push_beyond_capacity_raises_queue_full_counting_processing_jobs():
    q = LocalQueue(1, 2)
    q.push(job(1), 0.0)
    q.pop(0.0)
    q.push(job(2), 0.0)
    assert q.free == 0
    with pytest.raises(QueueFull, match="full"):
        q.push(job(3), 0.0)
    q.done(1)
    q.push(job(3), 0.0)


def test_drop_shard_leaves_processing_jobs_and_other_shards_alone():
    q = LocalQueue(2, 10)
    q.push(job(1, shard=7), 0.0)
    q.pop(0.0)
    q.push(job(2, shard=7), 0.0)
    q.push(job(3, shard=7, run_after=9.0), 0.0)
    q.push(job(4, shard=8), 0.0)
    assert [j.id for j in q.drop_shard(7)] == [2, 3]
    assert q.processing == 1 and q.buffered == 1
    assert q.drop_shard(7) == []
    assert q.pop(0.0).id == 4


def test_done_of_an_unknown_job_is_a_clear_error():
    q = LocalQueue(1, 2)
    with pytest.raises(KeyError, match="not processing"):
        q.done(42)


def test_bad_construction_arguments_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        LocalQueue(3, 10)
    with pytest.raises(ValueError, match="capacity"):
        LocalQueue(2, 0)


def test_threads_lose_nothing_duplicate_nothing_and_keep_per_key_fifo():
    q = LocalQueue(4, 64)
    total = 3000
    jobs = [
        job(i, QUEUES[i % 4], priority=i % 3, key=f"k{i % 10}", ordered=i % 2 == 0, shard=i % 10) for i in range(total)
    ]
    started = []  # (key, id) of ordered jobs, in start order
    guard = threading.Lock()
    running_keys = set()
    errors = []
    seen = []
    pushed = threading.Event()

    def fetcher():
        deadline = time.monotonic() + 30
        for j in jobs:
            while True:
                try:
                    q.push(j, 0.0)
                    break
                except QueueFull:
                    if time.monotonic() > deadline:
                        errors.append("fetcher stuck")
                        return
                    time.sleep(0.0001)  # back-pressure: wait for executors
        pushed.set()

    def executor():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = q.pop(0.0)
            if got is None:
                if pushed.is_set() and q.buffered == 0:
                    return
                time.sleep(0.0001)
                continue
            with guard:
                seen.append(got.id)
                if got.ordered:
                    if got.key in running_keys:
                        errors.append(f"two jobs of {got.key} at once")
                    running_keys.add(got.key)
                    started.append((got.key, got.id))
            with guard:
                if got.ordered:
                    running_keys.discard(got.key)
            q.done(got.id)
        errors.append("executor deadline")

    threads = [threading.Thread(target=fetcher)] + [threading.Thread(target=executor) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sorted(seen) == list(range(total))
    assert q.buffered == q.processing == 0
    for key in {k for k, _ in started}:
        ids = [i for k, i in started if k == key]
        assert ids == sorted(ids), f"key {key} ran out of order"


# -- push_many / pop_many: the batch forms hand out what single calls do -------------

job_specs = st.lists(
    st.tuples(
        st.integers(0, 40),  # id (repeats: duplicates)
        st.sampled_from(QUEUES),
        st.integers(-2, 2),  # priority
        st.sampled_from([0.0, 0.5, 2.0]),  # run_after (now is 1.0: the 2.0 ones are delayed)
        st.sampled_from([None, "a", "b", "c", CAPPED_2, CAPPED_3]),  # key (ordered when a letter, capped when in CAPS)
    ),
    max_size=40,
)


def _queued(spec):
    job_id, queue, priority, run_after, key = spec
    shard = KEY_SHARD[key] if key else job_id % 4
    if key in CAPS:
        return QueuedJob(job_id, queue, priority, run_after, shard, key, cap=CAPS[key])
    return QueuedJob(job_id, queue, priority, run_after, shard, key, key is not None)


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("min_priority", [None, 0])
def test_push_many_and_pop_many_match_single_calls(lanes, min_priority):
    @settings(max_examples=150, deadline=None)
    @given(first=job_specs, second=job_specs, takes=st.lists(st.integers(1, 12), min_size=1, max_size=6))
    def check(first, second, takes):
        single, batched = LocalQueue(lanes, 24), LocalQueue(lanes, 24)
        for batch in (first, second):
            refused_single = []
            for spec in batch:
                try:
                    single.push(_queued(spec), 1.0)
                except (DuplicateJob, QueueFull):
                    refused_single.append(spec[0])
            refused_batched = [job.id for job in batched.push_many([_queued(spec) for spec in batch], 1.0)]
            assert refused_batched == refused_single
            for n in takes:
                one_by_one = []
                for _ in range(n):
                    job = single.pop(1.0, min_priority)
                    if job is None:
                        break
                    one_by_one.append(job.id)
                assert [job.id for job in batched.pop_many(1.0, n, min_priority)] == one_by_one
                for job_id in one_by_one[::2]:  # some finish: their keys pass on
                    single.done(job_id)
                    batched.done(job_id)
                    assert (job_id in single) == (job_id in batched)
            assert single.snapshot() == batched.snapshot()

    check()


@pytest.mark.parametrize("many", [False, True])
def test_a_run_after_that_is_no_finite_number_is_due_now_and_keeps_the_order(many):
    """A job's run_after comes from its row: not a finite number (NaN, an
    infinity; the claim quarantines such rows, this is the guard behind it)
    it would sit in the delayed index for good, holding a buffer slot, or
    compare false to every other key of a lane's heap. It is due now."""
    now = 1000.0
    jobs = [
        QueuedJob(1, "default", 0, float("inf"), 0),
        QueuedJob(2, "default", 5, float("nan"), 0),
        QueuedJob(3, "default", 1, now - 1, 0),
        QueuedJob(4, "default", 9, float("-inf"), 0),
        QueuedJob(5, "default", 3, now - 2, 0),
    ]
    q = LocalQueue(1, 10)
    if many:
        assert q.push_many(jobs, now) == []
    else:
        for job in jobs:
            q.push(job, now)
    assert q.next_due() is None
    popped = [q.pop(now) for _ in jobs]
    assert [job.id for job in popped if job is not None] == [4, 2, 5, 3, 1]
