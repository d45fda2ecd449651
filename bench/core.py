"""Benchmarks of shardq's in-memory structures against their stdlib rivals.

    python bench/core.py            # 1k and 65k entries, 3 runs each
    python bench/core.py --full     # adds the 1M-entry heap and index runs
    python bench/core.py --repeat 5

Prints one table and writes bench/results/core.json; ``--markdown FILE``
renders a results file for docs/benchmarks.md. Every figure is the median of
``--repeat`` runs (default 5); rivals run round-robin, and "× first" is the
median of per-round speed ratios against the first contender, which stays
meaningful on a loaded machine. Workloads are generated before the clock
starts so only the structure's operations are timed, in process CPU time.
Single thread except the "threads" row (wall time).
"""

import argparse
import functools
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardq.core import heap as heap_mod  # noqa: E402
from shardq.core import lru as lru_mod  # noqa: E402
from shardq.core import skiplist as skip_mod  # noqa: E402
from shardq.core.breaker import CircuitBreaker  # noqa: E402
from shardq.core.fifoset import FifoSet  # noqa: E402
from shardq.core.hashing import fnv1a_32, key_slot, lane_count, shard_key_hash  # noqa: E402
from shardq.core.localqueue import LocalQueue, QueuedJob, QueueFull  # noqa: E402
from shardq.core.rwlock import RWLock  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "core.json"
# Single-threaded cases are timed in process CPU time: the benchmark machines
# are shared, and CPU time is what another process's load disturbs least.
# The threaded case uses wall time (its CPU time would count spinning).
clock = time.process_time
wall_clock = time.perf_counter


# -- indexed priority queues ------------------------------------------------
def heap_fill_drain(cls, n, seed=1):
    rng = random.Random(seed)
    items = [(i, rng.randint(-100, 100), rng.random() * 1000.0) for i in range(n)]

    def run():
        q = cls()
        push = q.push
        t0 = clock()
        for i, prio, ra in items:
            push(i, prio, ra, i)
        pop = q.pop
        for _ in range(n):
            pop()
        return 2 * n, clock() - t0

    return run


def heap_mix(cls, n, ops=100_000, seed=2):
    """At size ~n: 40% push, 40% pop, 20% remove of a random live id."""
    rng = random.Random(seed)
    prefill = [(i, rng.randint(-100, 100), rng.random() * 1000.0) for i in range(n)]
    plan = []
    live = list(range(n))
    next_id = n
    for _ in range(ops):
        r = rng.random()
        if r < 0.4 or not live:
            plan.append((0, next_id, rng.randint(-100, 100), rng.random() * 1000.0))
            live.append(next_id)
            next_id += 1
        elif r < 0.8:
            plan.append((1, 0, 0, 0.0))
        else:
            j = rng.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            plan.append((2, live.pop(), 0, 0.0))

    def run():
        q = cls()
        for i, prio, ra in prefill:
            q.push(i, prio, ra, i)
        push, pop, remove = q.push, q.pop, q.remove
        t0 = clock()
        for kind, i, prio, ra in plan:
            if kind == 0:
                push(i, prio, ra, i)
            elif kind == 1:
                if q:
                    pop()
            else:
                remove(i)
        return ops, clock() - t0

    return run


# -- delayed-job index ---------------------------------------------------------
def delayed_mix(cls, n, ops=100_000, seed=3):
    """Size ~n; 45% add (time ahead of now), 10% remove, 45% pop_due(now += step)."""
    rng = random.Random(seed)
    horizon = 1000.0
    prefill = [(i, rng.random() * horizon) for i in range(n)]
    # Advance `now` so pops remove about as much as adds bring in.
    step = horizon / n * (0.45 / 0.45)
    plan = []
    next_id = n
    live = list(range(n))
    for _ in range(ops):
        r = rng.random()
        if r < 0.45:
            plan.append((0, next_id))
            live.append(next_id)
            next_id += 1
        elif r < 0.55 and live:
            j = rng.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            plan.append((1, live.pop()))
        else:
            plan.append((2, 0))

    def run():
        idx = cls()
        for i, t in prefill:
            idx.add(i, t, i)
        add, remove, pop_due = idx.add, idx.remove, idx.pop_due
        now = 0.0
        t0 = clock()
        for kind, i in plan:
            if kind == 0:
                add(i, now + horizon * ((i * 0.6180339887) % 1.0), i)
            elif kind == 1:
                remove(i)
            else:
                now += step
                pop_due(now)
        return ops, clock() - t0

    return run


# -- LRU ------------------------------------------------------------------
def lru_mix(cls, capacity=10_000, ops=200_000, seed=4):
    """80% get / 20% set over 2×capacity keys, skewed (hot tenth gets half)."""
    rng = random.Random(seed)
    keys = []
    for _ in range(ops):
        if rng.random() < 0.5:
            keys.append(rng.randrange(capacity // 5))
        else:
            keys.append(rng.randrange(capacity * 2))
    kinds = [rng.random() < 0.8 for _ in range(ops)]

    def run():
        c = cls(capacity)
        get, put = c.get, c.set
        t0 = clock()
        for k, is_get in zip(keys, kinds, strict=True):
            if is_get:
                get(k)
            else:
                put(k, k)
        return ops, clock() - t0

    return run


def lru_get_or_compute(kind, capacity=10_000, ops=200_000, seed=5):
    """The one pattern functools.lru_cache also serves: value = f(key), cached."""
    rng = random.Random(seed)
    keys = [rng.randrange(capacity // 5) if rng.random() < 0.5 else rng.randrange(capacity * 2) for _ in range(ops)]

    def compute(k):
        return k

    def run():
        if kind == "functools.lru_cache":
            f = functools.lru_cache(maxsize=capacity)(compute)
            t0 = clock()
            for k in keys:
                f(k)
        else:
            c = getattr(lru_mod, kind)(capacity)
            get, put = c.get, c.set
            t0 = clock()
            for k in keys:
                v = get(k)
                if v is None:
                    put(k, compute(k))
        return ops, clock() - t0

    return run


# -- small structures ---------------------------------------------------------
class _OrderedDictFifo:
    """The stdlib rival: evict the single oldest on every insert when full."""

    def __init__(self, capacity):
        self.capacity, self.members = capacity, OrderedDict()

    def add(self, member):
        members = self.members
        if member in members:
            return
        if len(members) >= self.capacity:
            members.popitem(last=False)
        members[member] = None

    def __contains__(self, member):
        return member in self.members

    def discard(self, member):
        self.members.pop(member, None)


class _DequeSetFifo:
    """A set for membership plus a deque for age, one eviction per insert."""

    def __init__(self, capacity):
        self.capacity, self.members, self.order = capacity, set(), deque()

    def add(self, member):
        if member in self.members:
            return
        if len(self.members) >= self.capacity:
            self.members.discard(self.order.popleft())
        self.members.add(member)
        self.order.append(member)

    def __contains__(self, member):
        return member in self.members


def fifoset_runtime(cls, capacity=8192, ops=300_000, in_flight=256):
    """The completer's pattern: remember each finished id, look it up when a
    claim comes back, forget it once its write lands (``in_flight`` later)."""

    def run():
        s = cls(capacity)
        add, discard = s.add, s.discard
        t0 = clock()
        for i in range(ops):
            add(i)
            _ = (i - 7) in s  # the membership test is the measured work
            discard(i - in_flight)
        return ops, clock() - t0

    return run


def fifoset_mix(cls, capacity=100_000, ops=300_000):
    """The worker's pattern: insert ids as they finish (always new, so the
    set stays full and evicts), look up a recent one now and then."""

    def run():
        s = cls(capacity)
        add = s.add
        t0 = clock()
        for i in range(ops):
            add(i)
            _ = (i - 7) in s  # the membership test is the measured work
        return ops, clock() - t0

    return run


def rwlock_uncontended(mode, ops=200_000):
    def run():
        if mode == "threading.Lock":
            lk = threading.Lock()
            acq, rel = lk.acquire, lk.release
        else:
            lk = RWLock()
            if mode == "RWLock read":
                acq, rel = lk.acquire_read, lk.release_read
            else:
                acq, rel = lk.acquire_write, lk.release_write
        t0 = clock()
        for _ in range(ops):
            acq()
            rel()
        return ops, clock() - t0

    return run


def breaker_mix(ops=200_000):
    def run():
        b = CircuitBreaker(failure_ratio=0.5, min_calls=20, window_seconds=10.0)
        allow, ok, fail = b.allow, b.record_success, b.record_failure
        now = 0.0
        t0 = clock()
        for i in range(ops):
            now += 0.001
            if allow(now):
                if i % 10:
                    ok(now)
                else:
                    fail(now)
        return ops, clock() - t0

    return run


def hash_rates(ops=100_000):
    keys = [f"order:{{{i}}}:line:{i % 7}" for i in range(ops)]
    out = {}
    for name, fn in (("fnv1a_32", fnv1a_32), ("shard_key_hash (mmh3)", shard_key_hash), ("key_slot (crc16)", key_slot)):

        def run(fn=fn):
            t0 = clock()
            for k in keys:
                fn(k)
            return ops, clock() - t0

        out[name] = run
    return out


# -- the local queue ------------------------------------------------------------
def _jobs(n, seed, ordered_share=0.0, delayed_share=0.0, queues=8, shards=64):
    rng = random.Random(seed)
    names = [f"queue-{i}" for i in range(queues)]
    out = []
    for i in range(n):
        ordered = rng.random() < ordered_share
        out.append(
            QueuedJob(
                id=i,
                queue_name=names[i % queues],
                priority=rng.choice((0, 0, 0, 10, -10, 50)),
                run_after=(rng.random() * 0.5) if rng.random() < delayed_share else 0.0,
                shard=rng.randrange(shards),
                key=f"k{rng.randrange(200)}" if ordered else None,
                ordered=ordered,
            )
        )
    return out


def localqueue_cycle(lanes, n=200_000, backlog=1_000, ordered_share=0.0, delayed_share=0.0, seed=6):
    """Steady state: keep ~backlog buffered; each cycle = push + pop + done."""
    jobs = _jobs(n + backlog, seed, ordered_share, delayed_share)

    def run():
        q = LocalQueue(lanes, backlog * 4)
        push, pop, done = q.push, q.pop, q.done
        for j in jobs[:backlog]:
            push(j, 0.0)
        now = 0.0
        t0 = clock()
        for j in jobs[backlog:]:
            now += 0.00001
            push(j, now)
            got = pop(now)
            if got is not None:
                done(got.id)
        return n, clock() - t0

    return run


def localqueue_threads(lanes, n=200_000, executors=4, seed=7):
    """One fetcher thread pushes, ``executors`` threads pop and done."""
    jobs = _jobs(n, seed, ordered_share=0.1)

    def run():
        q = LocalQueue(lanes, 2_000)
        finished = [0] * executors
        stop = threading.Event()

        def fetcher():
            push = q.push
            for j in jobs:
                while True:
                    try:
                        push(j, 0.0)
                        break
                    except QueueFull:  # wait for the executors (spin)
                        time.sleep(0)

        def executor(slot):
            pop, done = q.pop, q.done
            count = 0
            while True:
                got = pop(0.0)
                if got is None:
                    if stop.is_set() and q.buffered == 0:
                        break
                    time.sleep(0)
                    continue
                done(got.id)
                count += 1
            finished[slot] = count

        threads = [threading.Thread(target=executor, args=(i,)) for i in range(executors)]
        t0 = wall_clock()
        for t in threads:
            t.start()
        fetcher()
        stop.set()
        for t in threads:
            t.join()
        elapsed = wall_clock() - t0
        assert sum(finished) == n, (sum(finished), n)
        return n, elapsed

    return run


def markdown(results):
    """The rows of a results file as a Markdown table (for docs/benchmarks.md)."""
    lines = ["| structure | workload | implementation | median ops/s | × first |", "|---|---|---|---:|---:|"]
    for row in results["rows"]:
        lines.append(
            f"| {row['group']} | {row['case']} | {row['impl']} | {row['ops_per_s']:,} | {row['vs_first']:.2f} |"
        )
    return "\n".join(lines)


# -- driver ---------------------------------------------------------------------
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="add the 1M-entry runs")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--markdown", metavar="JSON", help="print a results file as a Markdown table and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    repeat = max(1, args.repeat)

    rows = []

    def compare(group, case, contenders):
        """Run the contenders round-robin ``repeat`` times (so a change in the
        machine's load hits all of them alike); report each one's median and,
        against the first, the median of the per-round speed ratios."""
        rates = {impl: [] for impl, _ in contenders}
        for _ in range(repeat):
            for impl, fn in contenders:
                ops, seconds = fn()
                rates[impl].append(ops / seconds)
        base = contenders[0][0]
        for impl, _ in contenders:
            runs = rates[impl]
            med = statistics.median(runs)
            ratio = statistics.median(r / b for r, b in zip(runs, rates[base], strict=True))
            rows.append(
                {
                    "group": group,
                    "case": case,
                    "impl": impl,
                    "ops_per_s": round(med),
                    "vs_first": round(ratio, 2),
                    "runs": [round(r) for r in runs],
                }
            )
            print(f"{group:<14} {case:<36} {impl:<24} {med:>12,.0f} ops/s  ×{ratio:.2f}", flush=True)

    def measure(group, case, impl, fn):
        compare(group, case, [(impl, fn)])

    sizes = [1_000, 65_536] + ([1_000_000] if args.full else [])
    heaps = [("4-ary (pure Python)", heap_mod.QuaternaryIndexedQueue), ("heapq (C)", heap_mod.HeapqIndexedQueue)]
    for n in sizes:
        compare("indexed heap", f"fill {n:,} then drain", [(name, heap_fill_drain(cls, n)) for name, cls in heaps])
        compare("indexed heap", f"push/pop/remove 40/40/20 @ {n:,}", [(name, heap_mix(cls, n)) for name, cls in heaps])

    indexes = [
        ("skip list (pure Python)", skip_mod.SkipListDelayedIndex),
        ("SortedList", skip_mod.SortedListDelayedIndex),
    ]
    # Extra sizes locate the crossover the factory's threshold is based on.
    for n in sorted({*sizes, 8_192, 32_768}):
        compare("delayed index", f"add/remove/pop_due @ {n:,}", [(name, delayed_mix(cls, n)) for name, cls in indexes])

    lrus = [("LinkedLRU (pure Python)", lru_mod.LinkedLRU), ("OrderedDictLRU", lru_mod.OrderedDictLRU)]
    compare("LRU", "get/set 80/20, cap 10k", [(name, lru_mix(cls)) for name, cls in lrus])
    compare(
        "LRU",
        "get-or-compute, cap 10k",
        [(kind, lru_get_or_compute(kind)) for kind in ("LinkedLRU", "OrderedDictLRU", "functools.lru_cache")],
    )

    compare(
        "FIFO set",
        "add + contains, cap 100k, full",
        [
            ("FifoSet (10% batch eviction)", fifoset_mix(FifoSet)),
            ("OrderedDict, evict 1 per add", fifoset_mix(_OrderedDictFifo)),
            ("set + deque, evict 1 per add", fifoset_mix(_DequeSetFifo)),
        ],
    )
    # set + deque has no O(1) discard (a deque removes from the middle in O(n)).
    compare(
        "FIFO set",
        "add + contains + discard (completer), cap 8k",
        [
            ("FifoSet (10% batch eviction)", fifoset_runtime(FifoSet)),
            ("OrderedDict, evict 1 per add", fifoset_runtime(_OrderedDictFifo)),
        ],
    )
    compare(
        "lock",
        "uncontended acquire+release",
        [(mode, rwlock_uncontended(mode)) for mode in ("threading.Lock", "RWLock read", "RWLock write")],
    )
    measure("breaker", "allow + record", "CircuitBreaker", breaker_mix())
    compare("hash", "hash one key", list(hash_rates().items()))

    cores = os.cpu_count() or 1
    for lanes in sorted({lane_count(cores), 64}):
        measure("LocalQueue", f"push+pop+done, {lanes} lanes", "cycles", localqueue_cycle(lanes))
        measure(
            "LocalQueue", f"… 10% ordered keys, {lanes} lanes", "cycles", localqueue_cycle(lanes, ordered_share=0.1)
        )
        measure("LocalQueue", f"… 20% delayed, {lanes} lanes", "cycles", localqueue_cycle(lanes, delayed_share=0.2))
        measure("LocalQueue", f"threads 1 push + 4 pop, {lanes} lanes", "jobs", localqueue_threads(lanes))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "implementation": platform.python_implementation(),
                "machine": platform.machine(),
                "cpu_count": cores,
                "repeat": repeat,
                "full": args.full,
                "chosen": {
                    "indexed_queue": heap_mod.FastestIndexedQueue.__name__,
                    "delayed_index": {
                        "up to entries": skip_mod.SKIPLIST_MAX_ENTRIES,
                        "small": skip_mod.delayed_index_class(1).__name__,
                        "large": skip_mod.delayed_index_class(None).__name__,
                    },
                    "lru": lru_mod.FastestLRU.__name__,
                },
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
