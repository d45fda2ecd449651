"""Dead-owner detection (docs/reliability.md, "A worker that dies"): a
worker whose lease session is gone from the server is not counted live and
its shards are taken over at once, under a new fence, by a peer that names
it; a live session, a reused pid, an identity of another server, a pooled
connection and detection turned off never make a worker dead.

Real sessions: a worker's "death" is its store's connection closing (the
server ends the backend as it does for a SIGKILLed process's socket);
tests/faults/test_dead_owner.py SIGKILLs real worker processes."""

import threading
import time
import uuid

import pytest

from shardq.db.store import WorkerStore, ensure_shards
from tests.helpers import in_process_worker, job_factory, scalar, sql, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 64
TTL = 30.0


@pytest.fixture
def stores():
    opened: list[WorkerStore] = []

    def store() -> WorkerStore:
        opened.append(WorkerStore(application_name="test-dead-owner"))
        return opened[-1]

    yield store
    for each in opened:
        each.close()


def scalar_pid(store: WorkerStore) -> int:
    """The backend pid of ``store``'s connection (opened if needed)."""
    return store.guarded("pid", lambda cursor: cursor.execute("SELECT pg_backend_pid()").fetchone()[0])


def end_session(store: WorkerStore) -> int:
    """Close ``store``'s connection and wait until the server's backend is gone; its pid."""
    pid = scalar_pid(store)
    store.close()
    wait_until(
        lambda: scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]) == 0,
        timeout=10,
        message=f"backend {pid} to end",
    )
    return pid


def register(store: WorkerStore, **kwargs) -> str:
    worker = str(uuid.uuid4())
    store.register_worker(worker, "test", 1, [], **kwargs)
    return worker


def test_a_worker_whose_session_ended_is_taken_for_dead_only_by_a_peer_that_names_it(stores):
    ensure_shards()
    store_a, store_b = stores(), stores()
    a, b = register(store_a), register(store_b)
    taken = store_a.claim_shards(a, SHARDS, TTL, SHARDS, 3)
    versions = {row["shard"]: row["claim_version"] for row in taken}
    # A RUNNING job of A's, and a claimed one: the takeover rescues both.
    running, claimed = job_factory(2, shard=0)
    sql(
        "UPDATE shardq_job SET status = 'RUNNING', fence = %s, status_rank = 2, attempts = 1, "
        "started_at = clock_timestamp() WHERE id = %s",
        [versions[0], running],
    )
    sql("UPDATE shardq_job SET status = 'CLAIMED', fence = %s, status_rank = 1 WHERE id = %s", [versions[0], claimed])

    # A's session lives: no dead owner, and naming A changes nothing.
    assert store_b.dead_owners(b, TTL) == []
    assert set(store_b.heartbeat(b, {}, TTL)) == {a, b}
    assert store_b.claim_shards(b, SHARDS, TTL, SHARDS, 3, dead=[a]) == []

    pid = end_session(store_a)
    assert store_b.dead_owners(b, TTL) == [(a, pid, True, False)]
    # Not named: A is still live (its heartbeat is fresh) and its leases hold.
    assert set(store_b.heartbeat(b, {}, TTL)) == {a, b}
    assert store_b.claim_shards(b, SHARDS, TTL, SHARDS, 3) == []
    # Named: B alone is live and takes every shard, under new fences, rescuing A's jobs.
    assert store_b.beat(b, {}, TTL, dead=[a])[0] == [b]
    taken = store_b.claim_shards(b, SHARDS, TTL, SHARDS, 3, dead=[a])
    assert sorted(row["shard"] for row in taken) == list(range(SHARDS))
    assert {row["previous_owner"] for row in taken} == {uuid.UUID(a)}
    assert all(row["claim_version"] > versions[row["shard"]] for row in taken)
    assert {row["shard"]: row["rescued"] for row in taken if row["rescued"]} == {0: 2}
    assert sql(
        "SELECT id, status, worker_losses FROM shardq_job WHERE id = ANY(%s) ORDER BY id", [[running, claimed]]
    ) == [
        (running, "READY", 1),
        (claimed, "READY", 0),
    ]
    # A dead owner that holds nothing any more is still reported (not live), without leases.
    assert store_b.dead_owners(b, TTL) == [(a, pid, False, False)]

    # A was alive after all (its connection dropped and came back: a new
    # session): the fence stands, as after an expiry. It renews nothing,
    # and its new session makes it live again at its next heartbeat.
    assert store_a.renew_leases(a, versions, TTL) == set()
    store_a.heartbeat(a, {}, TTL)
    assert store_b.dead_owners(b, TTL) == []
    assert set(store_b.beat(b, {}, TTL, dead=[a])[0]) == {a, b}


def test_a_reused_pid_or_another_servers_identity_never_keeps_or_makes_a_worker_dead(stores):
    ensure_shards()
    store_a, store_b = stores(), stores()
    a, b = register(store_a), register(store_b)
    store_a.claim_shards(a, 4, TTL, SHARDS, 3)
    live_pid = scalar_pid(store_b)
    live_start = scalar("SELECT backend_start FROM pg_stat_activity WHERE pid = %s", [live_pid])
    end_session(store_a)

    def identity(pid, start, server):
        sql(
            "UPDATE shardq_worker SET backend_pid = %s, backend_start = "
            + start
            + ", server_started = "
            + server
            + " WHERE id = %s",
            [pid, a],
        )
        return store_b.dead_owners(b, TTL)

    here = "pg_postmaster_start_time()"
    # A pid another session holds now, with that session's start: alive.
    assert identity(live_pid, f"'{live_start.isoformat()}'::timestamptz", here) == []
    # The same pid with another start: the pid was reused, A's session is gone.
    assert identity(live_pid, "'2001-01-01 00:00:00+00'", here) == [(a, live_pid, True, False)]
    # A start we cannot compare (NULL): the pid's session counts as A's.
    assert identity(live_pid, "NULL", here) == []
    # Recorded on another server (before a failover or a restart): never looked up here.
    assert identity(2**31 - 1, "NULL", here) == [(a, 2**31 - 1, True, False)]
    assert identity(2**31 - 1, "NULL", "pg_postmaster_start_time() - interval '1 second'") == []
    assert identity(2**31 - 1, "NULL", "NULL") == []
    # And the claim looks again for itself: a peer that names A takes none
    # of A's shards (0-3: a shard count of 4 leaves the free ones out).
    assert store_b.claim_shards(b, 4, TTL, 4, 3, dead=[a]) == []


def test_a_worker_whose_lease_and_listen_sessions_both_ended_is_gone_whole(stores):
    """The LISTEN session, recorded beside the lease session: the lease
    session alone gone, with the LISTEN session there, is a live process
    whose connection dropped (not listed: its leases expire as ever); both
    gone a dead process (no wait)."""
    ensure_shards()
    store_a, listen_a, store_b = stores(), stores(), stores()
    a, b = register(store_a), register(store_b)
    store_a.claim_shards(a, 4, TTL, SHARDS, 3)
    listener = scalar_pid(listen_a)
    listen_a.run("record_listener", {"worker": a, "client_pid": listener}, fetch="none")  # as store.record_listener
    assert scalar("SELECT listener_pid FROM shardq_worker WHERE id = %s", [a]) == listener
    pid = end_session(store_a)
    assert store_b.dead_owners(b, TTL) == []
    end_session(listen_a)
    assert store_b.dead_owners(b, TTL) == [(a, pid, True, True)]
    # A LISTEN session of another server is never recorded, and one recorded
    # before the lease session moved to another server is forgotten at its heartbeat.
    sql("UPDATE shardq_worker SET server_started = server_started - interval '1 second' WHERE id = %s", [a])
    listen_a.run("record_listener", {"worker": a, "client_pid": scalar_pid(listen_a)}, fetch="none")
    assert scalar("SELECT listener_pid FROM shardq_worker WHERE id = %s", [a]) is None
    sql("UPDATE shardq_worker SET listener_pid = 1 WHERE id = %s", [a])
    store_a.heartbeat(a, {}, TTL)
    assert scalar("SELECT listener_pid FROM shardq_worker WHERE id = %s", [a]) is None


def test_nothing_is_recorded_for_a_worker_with_detection_off_or_behind_a_pooler(stores):
    ensure_shards()
    store = stores()
    off = register(store, identity=False)
    on = register(store)
    pid = scalar_pid(store)
    assert sql("SELECT backend_pid, server_started IS NOT NULL FROM shardq_worker WHERE id = %s", [on]) == [(pid, True)]
    assert sql("SELECT backend_pid, backend_start, server_started FROM shardq_worker WHERE id = %s", [off]) == [
        (None, None, None)
    ]
    # A pooler tells the client a pid of its own: the heartbeat records nothing.
    store.run(
        "heartbeat",
        {"worker": on, "stats": "{}", "ttl": TTL, "pool": "*", "now": None, "dead": [], "client_pid": pid + 1},
    )
    assert sql("SELECT backend_pid, backend_start, server_started FROM shardq_worker WHERE id = %s", [on]) == [
        (None, None, None)
    ]
    store.heartbeat(on, {}, TTL)
    assert scalar("SELECT backend_pid FROM shardq_worker WHERE id = %s", [on]) == pid


def test_a_running_worker_takes_a_dead_peers_shards_long_before_its_lease_ends(stores, settings):
    """The leaser's check finds the peer's session gone and the next round
    takes its shards: within seconds of the worker's registration (a fraction
    of one on a quiet machine), with the peer's leases good for a minute
    and HEARTBEAT 10 s."""
    settings.SHARDQ = {**settings.SHARDQ, "LEASE_TTL": 60.0, "HEARTBEAT": 10.0, "METRICS_PORT": None}
    ensure_shards()
    peer_store = stores()
    peer = register(peer_store)
    held = {row["shard"] for row in peer_store.claim_shards(peer, 32, 60.0, SHARDS, 3)}
    assert len(held) == 32
    end_session(peer_store)
    with in_process_worker(concurrency=1) as worker:
        assert worker.stats["dead_owners"] == 1
        assert worker.stats["dead_owner_takeovers"] == 32
        assert scalar("SELECT count(*) FROM shardq_shard WHERE owner = %s", [worker.id]) == SHARDS
        [(took,)] = sql(
            "SELECT extract(epoch FROM max(e.at) - min(w.started_at))::float8 FROM shardq_shard_event AS e "
            "JOIN shardq_worker AS w ON w.id = e.worker WHERE e.worker = %s AND e.reason = 'takeover'",
            [worker.id],
        )
    # Registration, a first round (32 free shards), the peer seen gone for
    # two checks (0.2 s), a round: 0.3 s at a load of 10, 2 s at 30.
    assert took < 10.0, took


def test_a_worker_whose_lease_connection_drops_keeps_its_shards(settings):
    """The other side of the grace: a live worker's lease session ended by
    the server (pg_terminate_backend) is seen gone by its peer, but its own
    check fails first and its round records the new session before the peer
    has seen the old one gone for two checks: nothing is taken."""
    settings.SHARDQ = {
        **settings.SHARDQ,
        "LEASE_TTL": TTL,
        "HEARTBEAT": 10.0,
        "METRICS_PORT": None,
        "DEAD_OWNER_CHECK": 0.5,
    }
    from shardq.worker.runtime import Worker, WorkerOptions

    ensure_shards()
    first = Worker(WorkerOptions(concurrency=1))
    second = Worker(WorkerOptions(concurrency=1))
    threads = [threading.Thread(target=w.run, name=f"test-worker-{i}") for i, w in enumerate((first, second))]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(first.leaser.held) == 32 and len(second.leaser.held) == 32, timeout=30)
        held = dict(first.leaser.held)
        pid = scalar("SELECT backend_pid FROM shardq_worker WHERE id = %s", [first.id])
        assert scalar("SELECT pg_terminate_backend(%s)", [pid])
        wait_until(
            lambda: scalar("SELECT backend_pid FROM shardq_worker WHERE id = %s", [first.id]) not in (pid, None),
            timeout=10,
            message="the first worker's new session recorded",
        )
        time.sleep(1.5)  # three of the peer's checks: time to take the shards, were it to
        assert dict(first.leaser.held) == held
        assert second.stats["dead_owners"] == 0 and second.stats["dead_owner_takeovers"] == 0
        assert first.stats["self_fences"] == 0
    finally:
        for worker in (first, second):
            worker.request_stop()
        for thread in threads:
            thread.join(timeout=60)
