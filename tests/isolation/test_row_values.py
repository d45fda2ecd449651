"""One row never stops a worker (issue 24, DESIGN §5): whatever a job row
holds, the claim reads it at one boundary (``job_problem`` in
shardq/db/queries.sql) and quarantines a row it cannot read — FAILED with an
UnreadableJob error naming the column and the value — while the rest of the
claim goes on. So do the other statements that read rows of any age: the
idle fetcher's ``seconds_until_due``, the takeover's rescue and the
workflow resolver.

The store tests claim directly (one statement, no worker); the worker tests
run a ``Worker`` in this process on real PostgreSQL. The property test over
every column of ``shardq_job`` is tests/isolation/test_row_properties.py.
"""

import dataclasses
import json
import os
import sys
import time
import uuid

import pytest

import shardq
from shardq import exponential
from shardq.conf import get_config
from shardq.db.store import WorkerStore
from shardq.worker.jobs import ClaimedJob
from shardq.worker.limits import Limiter
from tests.helpers import in_process_worker, job_factory, job_row, leased_shard_factory, sql, wait_until
from tests.taskapp import limit_tasks
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db(transaction=True)

THREE_AT_ONCE = "t:tests.taskapp.limit_tasks.three_at_once"  # max_concurrency=3
LIMITED_PATH = "tests.taskapp.limit_tasks.three_at_once"


def poison(setter: str, **job) -> int:
    """A READY job (as enqueue writes it, on shard 3 unless told) with one
    ``SET`` clause of raw SQL applied, as a hand-written UPDATE leaves it."""
    [job_id] = job_factory(1, **{"shard": 3, **job})
    sql(f"UPDATE shardq_job SET {setter} WHERE id = %s", [job_id])
    return job_id


def unreadable_error(job_id: int) -> str:
    """The UnreadableJob traceback the quarantine wrote on the job ('' when
    none), read in SQL: the row's other values may be ones Python cannot hold."""
    rows = sql(
        "SELECT e ->> 'traceback' FROM shardq_job AS j, "
        "jsonb_array_elements(CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors ELSE '[]' END) AS e "
        "WHERE j.id = %s AND e ->> 'exception_class_path' = 'shardq.exceptions.UnreadableJob'",
        [job_id],
    )
    return rows[-1][0] if rows else ""


def status_of(job_id: int) -> str:
    return sql("SELECT status FROM shardq_job WHERE id = %s", [job_id])[0][0]


def claim(worker: str, shards: list[int]) -> list[ClaimedJob]:
    store = WorkerStore(application_name="test-row-values")
    try:
        return store.claim_jobs(worker, shards, None, 50, 50, row_factory=ClaimedJob)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("setter", "named"),
    [
        ("priority = 32767", "priority 32767 is outside -100..100"),
        ("priority = -101", "priority -101 is outside -100..100"),
        ("max_attempts = 0", "max_attempts 0 is below 1"),
        ("max_attempts = -2147483648", "max_attempts -2147483648 is below 1"),
        ("attempts = -1", "attempts -1 is out of range"),
        ("status_rank = 2147483647", "status_rank 2147483647 is out of range"),
        ("run_after = '-infinity'", "run_after -infinity is not a time of the years 1 to 9999"),
        ("run_after = '4713-01-01 BC'", "run_after 4713-01-01 00:00:00+00 BC is not a time of the years 1 to 9999"),
        ("enqueued_at = '20000-01-01'", "enqueued_at 20000-01-01 00:00:00+00 is not a time of the years 1 to 9999"),
        ("started_at = '294276-12-31'", "started_at 294276-12-31 00:00:00+00 is not a time of the years 1 to 9999"),
        ("last_attempted_at = 'infinity'", "last_attempted_at infinity is not a time of the years 1 to 9999"),
        ("args = '{}'", "args {} is not a JSON array"),
        ("kwargs = '[]'", "kwargs [] is not a JSON object"),
        ("errors = '7'", "errors 7 is not a JSON array"),
        ("worker_ids = 'null'", "worker_ids null is not a JSON array"),
        (f"args = '{'[' * 300}{']' * 300}'", "args is nested deeper than 200 lists or objects"),
        (f"""kwargs = '{{"a": {"[" * 250}{"]" * 250}}}'""", "kwargs is nested deeper than 200 lists or objects"),
        (f"args = '[{'9' * 4301}]'", "args holds a number of more than 4300 digits"),
        ("worker_ids = '[-1e5000]'", "worker_ids holds a number of more than 4300 digits"),
        (f"errors = '[{'[' * 201}{']' * 201}]'", "errors is nested deeper than 200 lists or objects"),
    ],
)
def test_the_claim_quarantines_an_unreadable_row_naming_its_column_and_takes_the_rest(setter, named):
    worker, _ = leased_shard_factory([3])
    good = job_factory(2, shard=3)
    bad = poison(setter)
    jobs = {job.id: job for job in claim(worker, [3])}
    assert set(jobs) == {*good, bad}
    assert jobs[bad].problem == named
    assert all(jobs[i].problem is None for i in good)
    status = dict(sql("SELECT id, status FROM shardq_job WHERE id = ANY(%s)", [[*good, bad]]))
    assert status == {good[0]: "CLAIMED", good[1]: "CLAIMED", bad: "FAILED"}
    error = unreadable_error(bad)
    assert f"job {bad} was not run: {named}" in error, error
    # Nothing of it is counted: it never started.
    attempts = sql("SELECT attempts FROM shardq_job WHERE id = %s", [bad])[0][0]
    assert attempts == (-1 if setter == "attempts = -1" else 0)


def test_values_at_the_edge_of_what_the_claim_reads_are_not_quarantined():
    """The bounds are not tighter than what shardq writes: the extremes of
    a readable row run as any other."""
    worker, _ = leased_shard_factory([3])
    edge = [
        poison("priority = 100"),
        poison("priority = -100"),
        poison("max_attempts = 2147483647"),
        poison("run_after = '0001-01-03 00:00:00+00'"),
        # As deep as enqueue lets an argument be (100), inside the args list.
        poison(f"args = '[{'[' * 100}{']' * 100}]'"),
        poison(f"args = '[{'9' * 4300}, \"{'9' * 5000}\"]'"),
        poison("""errors = '[1, {"a": 2}]', worker_ids = '[3, null]'"""),
        poison("limit_keys = NULL"),
    ]
    jobs = claim(worker, [3])
    assert sorted(job.id for job in jobs) == sorted(edge)
    assert [job.problem for job in jobs] == [None] * len(edge)


def test_a_row_with_limit_keys_of_numbers_is_quarantined_by_the_limited_claim_and_the_worker_goes_on():
    """The issue's first row: the limiter read ``[1, 2]`` as limit keys and
    the fetcher died in ``spec`` (AttributeError on int), every restart too."""
    bad = poison("limit_keys = '[1, 2]'")
    scalar_key = poison("limit_keys = '{\"t:x\": 1}'")
    twice = poison(f"""limit_keys = '["{THREE_AT_ONCE}", "{THREE_AT_ONCE}"]'""")
    good = shardq.enqueue_many(t.noop, [((), {}) for _ in range(5)])
    limited = shardq.enqueue_many(limit_tasks.three_at_once, [((), {"n": i, "sleep": 0}) for i in range(5)])
    with in_process_worker(concurrency=2) as worker:
        wait_until(
            lambda: (
                all_done([r.id for r in [*good, *limited]])
                and all(unreadable_error(i) for i in (bad, scalar_key, twice))
            ),
            timeout=30,
            message=lambda: sql("SELECT id, status, limit_keys FROM shardq_job WHERE status <> 'SUCCESSFUL'"),
        )
        assert_alive(worker)
    assert "limit_keys [1, 2] holds a value that is not a string" in unreadable_error(bad)
    assert """limit_keys {"t:x": 1} is not a JSON array""" in unreadable_error(scalar_key)
    assert "names a limit twice" in unreadable_error(twice)


def test_the_limiter_knows_no_limit_by_a_key_that_is_not_a_string():
    """The guard behind the walk's quarantine: the limiter's ``spec`` took
    every key for a string (``key.startswith``), and one number stopped the
    fetcher."""
    settings = dataclasses.replace(get_config(), task_modules=("tests.taskapp.limit_tasks",))
    limiter = Limiter(worker_id="w", queue_limits={}, settings=settings)
    assert limiter.spec(1) is None  # type: ignore[arg-type]
    assert limiter.needs([{"id": 1, "limit_keys": [1, None, THREE_AT_ONCE]}]) == ({THREE_AT_ONCE: (3, 1)}, [])


def test_the_claim_into_owned_slots_quarantines_a_bare_string_key_instead_of_failing_whole():
    """A bare JSON string passes the owned claim's ``limit_keys <@ :keys``
    (a scalar is contained in an array holding it); expanding it as an
    array failed the statement, so every claim into owned slots was refused
    while the row stayed READY."""
    blocked = shardq.enqueue_many(limit_tasks.three_at_once, [((), {"n": i, "sleep": 0.5}) for i in range(3)])
    with in_process_worker(concurrency=4) as worker:
        # The worker owns slots of the limit while these three run.
        wait_until(lambda: worker.fetcher.limiter.owned_rooms(), timeout=20, message="owned slots with room")
        bad = poison(f"""limit_keys = '"{THREE_AT_ONCE}"'""", task_path=LIMITED_PATH)
        more = shardq.enqueue_many(limit_tasks.three_at_once, [((), {"n": i, "sleep": 0}) for i in range(6)])
        wait_until(
            lambda: all_done([r.id for r in [*blocked, *more]]) and unreadable_error(bad),
            timeout=30,
            message=lambda: sql("SELECT id, status, limit_keys FROM shardq_job WHERE status <> 'SUCCESSFUL'"),
        )
        assert worker.stats["claim_errors"] == 0
        assert_alive(worker)
    assert f'limit_keys "{THREE_AT_ONCE}" is not a JSON array' in unreadable_error(bad)


def test_a_ready_row_due_at_infinity_never_stops_the_idle_fetcher(settings):
    """The issue's second row: the idle fetcher asks when the next deferred
    job falls due, and 'infinity' minus now failed the statement, so the
    fetcher died (45 restarts in 75 s under the supervisor). Such a row is
    never due: it stays READY, and the fetcher's sleep follows the finite
    ones. (A 0.05 s poll: every idle round asks, whatever the interval; three
    rounds at the default 1 s took 3 s.)"""
    settings.SHARDQ = {**settings.SHARDQ, "POLL_INTERVAL": 0.05}
    never = poison("run_after = 'infinity'")
    leased_shard_factory(range(64))
    store = WorkerStore(application_name="test-row-values")
    try:
        assert store.seconds_until_due(list(range(64))) is None
        [later] = job_factory(1, shard=4, delay=120)
        assert 100 < store.seconds_until_due(list(range(64))) <= 120
    finally:
        store.close()
    sql("DELETE FROM shardq_job WHERE id = %s", [later])
    sql("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")
    good = shardq.enqueue_many(t.noop, [((), {}) for _ in range(5)])
    with in_process_worker(concurrency=2) as worker:
        wait_until(lambda: all_done([r.id for r in good]), timeout=20)
        # Idle rounds, each asking seconds_until_due.
        rounds = worker.stats["claim_statements"]
        wait_until(lambda: worker.stats["claim_statements"] >= rounds + 3, timeout=20, message="three idle rounds")
        assert_alive(worker)
    assert status_of(never) == "READY"


def test_the_rescue_of_a_running_row_with_worker_losses_at_the_integer_end_does_not_stop_the_leaser():
    """A takeover's rescue reads rows an earlier worker left CLAIMED or
    RUNNING: ``worker_losses + 1`` overflowed, the statement failed inside
    the leaser's tick, and the leaser (with the worker) died."""
    [lost] = job_factory(1, shard=5)
    sql(
        "UPDATE shardq_job SET status = 'RUNNING', fence = 0, status_rank = 2, attempts = 1, "
        "worker_ids = '[\"gone\"]', worker_losses = 2147483647 WHERE id = %s",
        [lost],
    )
    good = shardq.enqueue_many(t.noop, [((), {}) for _ in range(5)])
    with in_process_worker(concurrency=2) as worker:
        wait_until(lambda: all_done([r.id for r in good]), timeout=20)
        wait_until(lambda: job_row(lost)["status"] == "FAILED", timeout=20, message="the rescue of the lost job")
        assert_alive(worker)
    assert "WorkerLost" in json.dumps(job_row(lost)["errors"])


def test_the_resolver_moves_a_parents_other_children_past_one_with_counters_at_the_integer_end():
    """The resolver moves all children of a batch of parents in one
    statement: one child whose ``waiting_on`` or ``status_rank`` overflowed
    on the arithmetic failed the pass, every pass, and its siblings waited
    for good."""
    wf = shardq.Workflow(name=f"odd-{uuid.uuid4()}")
    parent = wf.add(t.noop)
    odd = wf.add(t.noop, after=[parent], step_name="odd")
    sibling = wf.add(t.noop, after=[parent], step_name="sibling")
    results = wf.enqueue()
    parent_id, odd_id, sibling_id = (int(r.id) for r in results)
    assert (parent.result.id, odd.result.id, sibling.result.id) == tuple(r.id for r in results)
    sql("UPDATE shardq_job SET waiting_on = -2147483648, status_rank = 2147483647 WHERE id = %s", [odd_id])
    with in_process_worker(concurrency=2) as worker:
        wait_until(lambda: all_done([parent_id, sibling_id]), timeout=30, message=lambda: job_row(sibling_id))
        # The odd child became READY too, at a rank the claim cannot read.
        wait_until(lambda: unreadable_error(odd_id), timeout=20, message=lambda: job_row(odd_id))
        assert worker.stats["resolver_errors"] == 0
        assert_alive(worker)
    assert "status_rank 2147483647 is out of range" in unreadable_error(odd_id)


def test_a_task_path_naming_a_broken_module_is_never_imported_and_dead_letters_that_job_only(settings):
    """A row may name any module of an installed app; one that raises
    something other than ImportError when imported (a half-deployed file,
    a module-level bug) raised it in the starter's thread, which died. Now a
    row's task path is never imported (issue 28 §6): the job is handed back
    for a worker that can run it, and dead-lettered, the path named, once
    none could for SHARDQ["UNKNOWN_TASK_TIMEOUT"]."""
    settings.SHARDQ = {**settings.SHARDQ, "UNKNOWN_TASK_TIMEOUT": 1.0}
    # Ordered: not started by its claim, so the starter resolves it first.
    bad = poison("task_path = 'tests.taskapp.broken_module.anything'", ordered=True)
    good = shardq.enqueue_many(t.noop, [((), {}) for _ in range(5)])
    with in_process_worker(concurrency=2) as worker:
        wait_until(lambda: all_done([r.id for r in good]) and job_row(bad)["status"] == "FAILED", timeout=20)
        assert_alive(worker)
    row = job_row(bad)
    [error] = row["errors"]
    assert error["exception_class_path"] == "shardq.exceptions.UnknownTask"
    assert "tests.taskapp.broken_module.anything" in error["traceback"], error
    assert "RuntimeError" not in error["traceback"] and "tests.taskapp.broken_module" not in sys.modules
    assert row["attempts"] == 0  # no attempt used: it never ran


def test_a_worker_imports_no_module_a_row_names(settings):
    """Issue 28 §6: a row's task path made a worker import any module under
    an installed app (running its import-time code) before it was refused.
    Task paths resolve only from the registry: the tasks of the installed
    apps' ``tasks`` modules and of SHARDQ["TASK_MODULES"]."""
    settings.SHARDQ = {**settings.SHARDQ, "UNKNOWN_TASK_TIMEOUT": 0.5}
    os.environ.pop("SHARDQ_IMPORT_ALARM", None)
    sys.modules.pop("tests.taskapp.import_alarm", None)
    named = poison("task_path = 'tests.taskapp.import_alarm.anything'")
    with in_process_worker(concurrency=2) as worker:
        wait_until(lambda: job_row(named)["status"] == "FAILED", timeout=20)
        assert_alive(worker)
    assert "tests.taskapp.import_alarm" not in sys.modules
    assert "SHARDQ_IMPORT_ALARM" not in os.environ


def test_the_issues_two_rows_leave_a_real_worker_process_running_with_no_restart(workers):
    """Issue 24 as reported, with a real ``shardq_worker --processes 2``: a
    row with limit_keys ``[1, 2]`` killed every worker within a second of its
    start, and a READY row due at 'infinity' killed the idle fetcher, which
    the supervisor restarted 45 times in 75 s."""
    numbers = poison("limit_keys = '[1, 2]'")
    never = poison("run_after = 'infinity'", shard=9)
    proc = workers.start("--concurrency", "2", "--processes", "2")
    good = shardq.enqueue_many(t.noop, [((), {}) for _ in range(20)])
    limited = shardq.enqueue_many(limit_tasks.three_at_once, [((), {"n": i, "sleep": 0}) for i in range(5)])
    wait_until(
        lambda: all_done([r.id for r in [*good, *limited]]) and unreadable_error(numbers),
        timeout=60,
        message=lambda: workers.log(proc)[-3000:],
    )
    # Idle for a few poll intervals (each asks seconds_until_due): still the same processes.
    children = sorted(workers.children(proc))
    assert len(children) == 2
    deadline = time.monotonic() + 3
    wait_until(lambda: time.monotonic() > deadline or proc.poll() is not None, timeout=10)
    assert proc.poll() is None
    assert sorted(workers.children(proc)) == children
    log = workers.log(proc)
    assert "restarting" not in log and "stopped unexpectedly" not in log, log[-3000:]
    assert f"job {numbers} (tests.taskapp.tasks.noop) quarantined: limit_keys [1, 2] holds" in log, log[-3000:]
    assert status_of(never) == "READY"


def test_the_retry_delay_of_any_attempt_is_at_most_the_cap_and_costs_nothing():
    """A failed attempt's retry delay is ``min(cap, base ** attempt)``, and
    attempts pass the claim up to 2147483000 (a task may allow as many, or a
    hand may write them): the power overflowed a float base past about 1,024
    doublings (the job failed with OverflowError instead of a retry) and, for
    an int base, took a minute of the executor thread's CPU to build a number
    of 600 million digits."""
    for base in (2, 2.0):
        backoff = exponential(base=base, cap=600, jitter=0)
        began = time.perf_counter()
        assert backoff.delay(1100) == backoff.delay(2147483000) == 600
        assert time.perf_counter() - began < 1.0
        assert [backoff.delay(n) for n in (1, 3, 9, 10)] == [2, 8, 512, 600]
    assert exponential(base=1, cap=600).delay(10**9) <= 1
    assert exponential(base=3, cap=0).delay(5) == 0


def all_done(ids) -> bool:
    rows = sql("SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND status = 'SUCCESSFUL'", [[int(i) for i in ids]])
    return rows[0][0] == len(ids)


def assert_alive(worker) -> None:
    failed = {service.name: repr(service.failure) for service in worker.services() if service.failure is not None}
    assert failed == {}
    assert all(service.alive for service in worker.services() if service.name != "executor"), [
        service.name for service in worker.services() if not service.alive
    ]
