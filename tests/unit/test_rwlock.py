"""RWLock with real threads: exclusion, writer priority, cancellable timeouts."""

import threading

import pytest

from shardq.core.rwlock import RWLock
from tests.conftest import wait_until as shared_wait_until


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
    with lock.write_locked():
        with pytest.raises(TimeoutError, match="read lock"):
            with lock.read_locked(timeout=0.01):
                pass
    with lock.read_locked(), lock.read_locked():
        with pytest.raises(TimeoutError, match="write lock"):
            with lock.write_locked(timeout=0):
                pass
    assert lock.readers == 0


def test_release_without_acquire_is_an_error():
    lock = RWLock()
    with pytest.raises(RuntimeError, match="release_read"):
        lock.release_read()
    with pytest.raises(RuntimeError, match="release_write"):
        lock.release_write()
