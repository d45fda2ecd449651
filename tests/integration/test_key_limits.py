"""A limit partitioned by the shard key is kept by the key's owner in its
local queue (docs/limits.md, "Limits by the shard key"): which calls get
``key_limited`` (and no ``limit_keys``) on every enqueue path, that the
claim never starts such a job itself, and that where two pools hold one
shard only one lease at a time has a key's jobs in flight. The cap itself,
across real workers, is tests/acceptance/test_key_limits.py's."""

import json

import pytest

import shardq
from shardq.core.limits import LimitSpec
from shardq.db.store import WorkerStore
from shardq.limits import KeyCaps, call_limits
from shardq.worker.jobs import ClaimedJob
from tests.helpers import job_factory, leased_shard_factory, sql
from tests.taskapp import key_limit_tasks as t
from tests.taskapp import limit_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)


def stored(result) -> tuple[bool, list | None]:
    [(key_limited, keys)] = sql("SELECT key_limited, limit_keys FROM shardq_job WHERE id = %s", [int(result.id)])
    return key_limited, keys if keys is None or isinstance(keys, list) else json.loads(keys)


def test_a_limit_by_the_shard_key_is_key_limited_with_no_limit_keys_on_every_enqueue_path():
    one = t.per_account.enqueue("acme", n=1)
    many = shardq.enqueue_many(t.per_account, [(("acme",), {"n": i}) for i in range(3)])
    unique = t.per_account_unique.enqueue("acme", n=7)
    flow = shardq.Workflow()
    first = flow.add(t.per_account, "acme", n=1)
    flow.add(t.per_account, "acme", n=2, after=[first])
    graph = flow.enqueue()
    by_callable = t.per_account_by_callable.enqueue(account="acme")
    ordered = t.per_account_ordered.enqueue("acme")
    for result in [one, *many, unique, *graph, by_callable, ordered]:
        assert stored(result) == (True, None), result.task.name


def test_other_partitions_stay_in_the_slot_table():
    cases = {
        "limited by another argument": (t.per_region.enqueue("acme", region="eu"), "t:{}=eu"),
        "salted key": (t.per_account_salted.enqueue("acme"), "t:{}=acme"),
        "with a rate limit": (t.per_account_with_rate.enqueue("acme"), "t:{}=acme"),
        # The call's shard key is not the limit's value: its jobs may be on
        # another shard than the value's other jobs.
        "shard key set by using()": (t.per_account.using(shard_key="other").enqueue("acme"), "t:{}=acme"),
        "no key": (limit_tasks.two_per_customer.enqueue(customer="acme"), "t:{}=acme"),
    }
    for what, (result, key) in cases.items():
        path = result.task.module_path
        assert stored(result) == (False, [key.format(path)]), what


def test_a_queue_limit_keeps_the_partition_in_the_slot_table_with_the_queue_key():
    queues = {"default": LimitSpec(max_concurrency=5, rate=None)}
    keys, local = call_limits(t.per_account, ("acme",), {}, "acme", queues)
    assert (keys, local) == (["q:default", f"t:{t.per_account.module_path}=acme"], False)
    assert call_limits(t.per_account, ("acme",), {}, "acme", {}) == (None, True)
    # A value too long for a slot key is still the key: compared in full.
    long = "x" * 500
    assert call_limits(t.per_account, (long,), {}, long, {}) == (None, True)
    assert call_limits(t.per_account, (long,), {}, long[:-1] + "y", {})[1] is False


def test_the_worker_reads_the_cap_from_the_task_and_holds_back_nothing_it_does_not_know():
    from shardq.tasks import resolve

    caps = KeyCaps(resolve)
    assert caps(t.per_account.module_path) == 2
    assert caps(t.per_account_by_callable.module_path) == 3
    assert caps(tasks.noop.module_path) is None  # no limit_by
    assert caps("tests.taskapp.key_limit_tasks.no_such_task") is None
    assert caps("os.system") is None  # never imported: not an installed app's
    small = KeyCaps(resolve, size=2)
    for path in [t.per_account.module_path, "a.b", "c.d", t.per_account.module_path]:
        small(path)
    assert len(small._caps) <= 2


def claim(worker, pool="*", **options):
    """One claim_jobs of shard 0 (``options``: full_keys)."""
    store = WorkerStore(application_name="test-key-limits")
    try:
        return store.claim_jobs(worker, [0], None, 20, 20, lookahead=1.0, row_factory=ClaimedJob, pool=pool, **options)
    finally:
        store.close()


def key_jobs(n: int, account: str = "k") -> list[int]:
    results = shardq.enqueue_many(t.per_account.using(shard_key=account), [((account,), {"n": i}) for i in range(n)])
    ids = [int(r.id) for r in results]
    sql("UPDATE shardq_job SET shard = 0 WHERE id = ANY(%s)", [ids])
    assert all(stored(r) == (True, None) for r in results)
    return ids


def test_the_claim_takes_key_limited_jobs_but_never_starts_them():
    worker, _ = leased_shard_factory([0])
    ids = key_jobs(4)
    [plain] = [int(r.id) for r in [tasks.noop.using(shard_key="z").enqueue()]]
    sql("UPDATE shardq_job SET shard = 0 WHERE id = %s", [plain])
    jobs = claim(worker)
    assert sorted(j.id for j in jobs) == sorted([*ids, plain])  # one lease: no guard, all of them
    assert not any(j.started for j in jobs)
    assert all(j.key_limited for j in jobs if j.id in ids)
    assert sql("SELECT DISTINCT status FROM shardq_job WHERE id = ANY(%s)", [ids]) == [("CLAIMED",)]


def two_pools_on_shard_0():
    sql(
        "INSERT INTO shardq_shard (pool, shard, owner, lease_expires, claim_version) "
        "VALUES ('default', 0, NULL, NULL, 0) ON CONFLICT DO NOTHING"
    )
    a, _ = leased_shard_factory([0], pool="*")
    b, _ = leased_shard_factory([0], pool="default")
    return a, b


def test_where_two_pools_hold_a_shard_one_lease_at_a_time_has_a_keys_jobs_in_flight():
    a, b = two_pools_on_shard_0()
    ids = key_jobs(4)
    other = key_jobs(1, account="j")
    # A's claim: a job whose earlier job of the key is READY waits for it.
    assert sorted(j.id for j in claim(a, "*")) == sorted([ids[0], *other])
    # B's: the key's earlier job is in flight under A's lease.
    assert claim(b, "default") == []
    # A again: its own job in flight is no obstacle, one more of the key.
    assert [j.id for j in claim(a, "*")] == [ids[1]]
    # A's jobs end: B may take the key now, one by one.
    sql("UPDATE shardq_job SET status = 'SUCCESSFUL' WHERE id = ANY(%s)", [ids[:2]])
    assert [j.id for j in claim(b, "default")] == [ids[2]]
    assert claim(a, "*") == []  # now B's lease has the key in flight
    assert [j.id for j in claim(b, "default")] == [ids[3]]


def test_a_key_whose_gate_has_jobs_waiting_is_passed_over_and_keeps_its_place():
    worker, _ = leased_shard_factory([0])
    full = key_jobs(3, account="full")
    other = key_jobs(2, account="open")
    jobs = claim(worker, full_keys=[(t.per_account.module_path, "full"), ("another.task", "open")])
    # "open" is full only for another task: its jobs come; "full"'s stay READY, untouched.
    assert sorted(j.id for j in jobs) == sorted(other)
    assert sql("SELECT DISTINCT status, status_rank FROM shardq_job WHERE id = ANY(%s)", [full]) == [("READY", 0)]
    assert sorted(j.id for j in claim(worker)) == sorted(full)  # the gate open: claimed in order


def test_a_key_limited_row_without_a_shard_key_is_claimed_and_not_held_back():
    worker, _ = leased_shard_factory([0])
    [job_id] = key_jobs(1, account="x")
    sql("UPDATE shardq_job SET shard_key = NULL WHERE id = %s", [job_id])
    jobs = claim(worker, full_keys=[(t.per_account.module_path, "x")])
    assert [j.id for j in jobs] == [job_id]
    from shardq.worker.buffer import Buffer

    buffer = Buffer(10, lanes=1, key_cap=KeyCaps(lambda path: t.per_account))
    assert buffer.push_many(jobs) == []
    assert buffer.held_back == 0 and buffer.pop(0.1).id == job_id  # no key: nothing to gate on


def test_the_buffer_runs_a_keys_cap_at_once_and_names_the_key_full_while_jobs_wait():
    from shardq.tasks import resolve
    from shardq.worker.buffer import Buffer

    worker, _ = leased_shard_factory([0])
    ids = key_jobs(4, account="k")
    [plain] = key_jobs(1, account="other")
    jobs = claim(worker)
    buffer = Buffer(20, lanes=2, key_cap=KeyCaps(resolve))
    assert buffer.push_many(jobs) == []
    assert buffer.held_back == 2
    assert buffer.full_keys() == [(t.per_account.module_path, "k")]
    popped = [buffer.pop(0.05) for _ in range(3)]
    assert sorted(j.id for j in popped) == sorted([ids[0], ids[1], plain])
    assert buffer.pop(0.05) is None  # two of "k" run: the cap
    buffer.done(next(j for j in popped if j.id == ids[0]))
    assert buffer.pop(0.05).id == ids[2]
    assert buffer.held_back == 1


def test_a_retried_job_waits_while_newer_jobs_of_its_key_are_in_flight_under_another_lease():
    """A retry is READY again with its old id, below the key's newer jobs,
    and due later than they are. A has a newer one in flight: B must not
    take the retry (the guard once looked at lower ids only)."""
    a, b = two_pools_on_shard_0()
    ids = key_jobs(3)
    sql("UPDATE shardq_job SET run_after = now() + interval '0.5 seconds' WHERE id = %s", [ids[0]])
    assert [j.id for j in claim(a, "*")] == [ids[1]]  # the claim's order: (run_after, id)
    assert claim(b, "default") == []  # the retry too: the key is in flight under A's lease
    assert [j.id for j in claim(a, "*")] == [ids[2]]
    assert [j.id for j in claim(a, "*")] == [ids[0]]


def test_of_two_ready_jobs_of_a_key_seen_by_two_claims_at_once_only_the_first_may_be_taken(second_connection):
    """A's claim has locked the key's first job in (run_after, id) order and
    not committed: B sees it READY and skips it. B must not take the other
    (a retry: lower id, later run_after), or each pool has the key in flight."""
    a, b = two_pools_on_shard_0()
    ids = key_jobs(2)
    sql("UPDATE shardq_job SET run_after = now() + interval '0.5 seconds' WHERE id = %s", [ids[0]])
    with second_connection.transaction():
        second_connection.execute("SELECT 1 FROM shardq_job WHERE id = %s FOR UPDATE", [ids[1]])
        assert claim(b, "default") == []
    assert [j.id for j in claim(a, "*")] == [ids[1]]
    assert claim(b, "default") == []


def test_an_ordered_keys_retried_job_waits_while_a_newer_job_of_its_key_runs_under_another_pool():
    """The same guard for ordered=True jobs (it once looked at lower ids
    only): a retry, READY again below a newer job of its key that the other
    pool runs, would have run beside it, two of one ordered key at once."""
    a, b = two_pools_on_shard_0()
    ids = job_factory(3, ordered=True, shard_key="k", task_path=tasks.noop.module_path)
    sql("UPDATE shardq_job SET run_after = now() + interval '0.5 seconds' WHERE id = %s", [ids[0]])
    assert [j.id for j in claim(a, "*")] == [ids[1]]
    assert claim(b, "default") == []
    sql("UPDATE shardq_job SET status = 'SUCCESSFUL' WHERE id = %s", [ids[1]])
    assert [j.id for j in claim(b, "default")] == [ids[2]]  # the next in (run_after, id) order
    assert claim(a, "*") == []  # the retry: the key is in flight under B's lease
