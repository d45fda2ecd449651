"""RWLock with real threads: exclusion, writer priority, cancellable timeouts."""

import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shardq.core.rwlock import RWLock
from tests.helpers import wait_until as shared_wait_until


def wait_until(predicate, timeout=5.0, interval=0.001):
    return shared_wait_until(predicate, timeout=timeout, interval=interval)


def start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def test_never_admits_a_writer_with_a_reader_or_two_writers():
    lock = RWLock()
    guard = threading.Lock()
    inside = {"readers": 0, "writers": 0}
    violations = []
    counts = {"reads": 0, "writes": 0}

    def reader(rounds):
        for _ in range(rounds):
            assert lock.acquire_read(timeout=10)
            with guard:
                inside["readers"] += 1
                if inside["writers"]:
                    violations.append("reader with writer")
            with guard:
                inside["readers"] -= 1
                counts["reads"] += 1
            lock.release_read()

    def writer(rounds):
        for i in range(rounds):
            # Mix timed and untimed acquires; a timeout is a legal outcome.
            if not lock.acquire_write(timeout=10 if i % 2 else None):
                continue
            with guard:
                inside["writers"] += 1
                if inside["writers"] > 1 or inside["readers"]:
                    violations.append(f"writer with {inside}")
            with guard:
                inside["writers"] -= 1
                counts["writes"] += 1
            lock.release_write()

    threads = [start(reader, 2000) for _ in range(6)] + [start(writer, 500) for _ in range(3)]
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert violations == []
    assert counts == {"reads": 12000, "writes": 1500}
    assert lock.readers == 0 and not lock.writer_active and lock.waiting == (0, 0)


def test_a_waiting_writer_holds_back_new_readers():
    lock = RWLock()
    assert lock.acquire_read()
    writer_in = threading.Event()

    def writer():
        lock.acquire_write()
        writer_in.set()
        lock.release_write()

    t = start(writer)
    wait_until(lambda: lock.waiting == (0, 1))
    # Writer priority: a new reader may not pass the waiting writer.
    assert lock.acquire_read(timeout=0.05) is False
    assert not writer_in.is_set()
    lock.release_read()
    t.join(timeout=5)
    assert writer_in.is_set()
    assert lock.acquire_read(timeout=0)
    lock.release_read()


def test_a_timed_out_reader_is_cancelled_and_leaves_no_trace():
    lock = RWLock()
    assert lock.acquire_write()
    assert lock.acquire_read(timeout=0.02) is False
    assert lock.waiting == (0, 0)
    assert lock.acquire_write(timeout=0) is False
    lock.release_write()
    assert lock.acquire_read(timeout=0)
    lock.release_read()


def test_a_cancelled_writer_lets_the_readers_queued_behind_it_in():
    lock = RWLock()
    assert lock.acquire_read()
    result = {}

    def writer():
        result["writer"] = lock.acquire_write(timeout=1.0)

    def late_reader():
        result["reader"] = lock.acquire_read()

    w = start(writer)
    wait_until(lambda: lock.waiting == (0, 1))
    r = start(late_reader)
    wait_until(lambda: lock.waiting == (1, 1))
    w.join(timeout=5)
    r.join(timeout=5)
    assert result == {"writer": False, "reader": True}
    assert lock.readers == 2
    lock.release_read()
    lock.release_read()
    assert lock.acquire_write(timeout=0)
    lock.release_write()


def test_releasing_a_writer_admits_every_waiting_reader_at_once():
    lock = RWLock()
    assert lock.acquire_write()
    entered = []
    release = threading.Event()

    def reader(i):
        lock.acquire_read()
        entered.append(i)
        release.wait(5)
        lock.release_read()

    threads = [start(reader, i) for i in range(4)]
    wait_until(lambda: lock.waiting == (4, 0))
    lock.release_write()
    wait_until(lambda: len(entered) == 4)
    assert lock.readers == 4
    release.set()
    for t in threads:
        t.join(timeout=5)
    assert lock.readers == 0


def test_writers_queue_in_arrival_order():
    lock = RWLock()
    assert lock.acquire_write()
    order = []

    def writer(i):
        lock.acquire_write()
        order.append(i)
        lock.release_write()

    threads = []
    for i in range(3):
        threads.append(start(writer, i))
        wait_until(lambda n=i + 1: lock.waiting == (0, n))
    lock.release_write()
    for t in threads:
        t.join(timeout=5)
    assert order == [0, 1, 2]


def test_context_managers_raise_timeout_error_on_timeout():
    lock = RWLock()
    with lock.write_locked(), pytest.raises(TimeoutError, match="read lock"), lock.read_locked(timeout=0.01):
        pass
    with (
        lock.read_locked(),
        lock.read_locked(),
        pytest.raises(TimeoutError, match="write lock"),
        lock.write_locked(timeout=0),
    ):
        pass
    assert lock.readers == 0


def test_release_without_acquire_is_an_error():
    lock = RWLock()
    with pytest.raises(RuntimeError, match="release_read"):
        lock.release_read()
    with pytest.raises(RuntimeError, match="release_write"):
        lock.release_write()


class RWLockMachine(RuleBasedStateMachine):
    """The lock against a model of its grant rules, with real parked threads.

    Holders are tokens ("r" or "w"); a parked waiter is a thread blocked in
    acquire_*. After every step the lock's counters equal the model's, and
    every waiter the model says was granted has returned from its acquire.
    """

    def __init__(self):
        super().__init__()
        self.lock = RWLock()
        self.readers = 0
        self.writer = False
        self.readers_waiting: list[threading.Event] = []
        self.writers_waiting: list[threading.Event] = []
        self.granted: list[threading.Event] = []  # waiters the model has let in
        self.holders: list[str] = []

    def _park(self, acquire) -> threading.Event:
        entered = threading.Event()

        def wait():
            acquire()
            entered.set()

        start(wait)
        return entered

    @rule()
    def read_without_waiting(self):
        admitted = not self.writer and not self.writers_waiting
        assert self.lock.acquire_read(timeout=0) is admitted
        if admitted:
            self.readers += 1
            self.holders.append("r")

    @rule()
    def write_without_waiting(self):
        admitted = not self.writer and not self.readers and not self.writers_waiting
        assert self.lock.acquire_write(timeout=0) is admitted
        if admitted:
            self.writer = True
            self.holders.append("w")

    @precondition(lambda self: self.writer or self.writers_waiting)
    @rule()
    def park_a_reader(self):
        entered = self._park(self.lock.acquire_read)
        self.readers_waiting.append(entered)
        wait_until(lambda: self.lock.waiting[0] == len(self.readers_waiting))

    @precondition(lambda self: self.writer or self.readers)
    @rule()
    def park_a_writer(self):
        entered = self._park(self.lock.acquire_write)
        self.writers_waiting.append(entered)
        wait_until(lambda: self.lock.waiting[1] == len(self.writers_waiting))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release_one(self, data):
        self._release(data.draw(st.sampled_from(sorted(set(self.holders)))))

    def _release(self, kind):
        self.holders.remove(kind)
        if kind == "r":
            self.lock.release_read()
            self.readers -= 1
            if self.readers == 0 and self.writers_waiting:
                self._grant_writer()
        else:
            self.lock.release_write()
            self.writer = False
            if self.readers_waiting:  # every waiting reader, as one batch
                self.readers += len(self.readers_waiting)
                self.holders += ["r"] * len(self.readers_waiting)
                self.granted += self.readers_waiting
                self.readers_waiting = []
            elif self.writers_waiting:
                self._grant_writer()

    def _grant_writer(self):
        self.writer = True
        self.holders.append("w")
        self.granted.append(self.writers_waiting.pop(0))

    @invariant()
    def the_lock_is_in_the_models_state(self):
        assert not (self.lock.writer_active and self.lock.readers), "a writer with readers"
        assert (self.lock.readers, self.lock.writer_active) == (self.readers, self.writer)
        assert self.lock.waiting == (len(self.readers_waiting), len(self.writers_waiting))
        for entered in self.granted:
            assert entered.wait(timeout=5), "a waiter the model let in is still blocked"
        for entered in self.readers_waiting + self.writers_waiting:
            assert not entered.is_set(), "a waiter got in that the model holds back"

    def teardown(self):
        # Let every parked thread in and out, so none outlives the example.
        while self.holders:
            self._release(self.holders[0])
        for entered in self.granted:
            assert entered.wait(timeout=5)


RWLockMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_rwlock_against_its_model = RWLockMachine.TestCase
