"""The worker's slot bookkeeping for concurrency limits (shardq/worker/limits.py),
through the Limiter's interface as the fetcher and the executor threads use
it: a claim (``needs``, ``walked``, ``pick``, ``claimed``), a thread's
``acquire`` and ``finished``, the fetcher's ``take_released``. No database:
the slot rows are ids the test hands out as ``take_limit_slots`` would.

The acceptance test (tests/acceptance/test_limits.py) runs three real
workers; these pin the rules whose breach stalled it: a worker kept a
limit's free slots while another ran one job at a time."""

import dataclasses
import threading

import pytest

from shardq.conf import get_config
from shardq.worker.limits import Limiter
from tests.helpers import wait_until

KEY = "t:tests.taskapp.limit_tasks.three_at_once"  # max_concurrency=3


def limiter(concurrency: int = 8) -> Limiter:
    settings = dataclasses.replace(
        get_config(),
        task_modules=("tests.taskapp.limit_tasks",),
        lease_ttl_seconds=30.0,
        heartbeat_seconds=10.0,
        poll_interval_seconds=1.0,
    )
    return Limiter(worker_id="w", queue_limits={}, settings=settings, concurrency=concurrency)


def rows(*ids: int) -> list[dict]:
    return [{"id": i, "limit_keys": [KEY]} for i in ids]


def claim(lim: Limiter, candidates: list[dict], slot_ids: list[int], limit: int = 100) -> list[int]:
    """One limited claim as Limiter.claim runs it; every job picked is claimed."""
    lim.full_keys()
    lim.walked(candidates, [])
    if not candidates:
        return []
    slots, _ = lim.needs(candidates, limit)
    wanted = slots.get(KEY, (3, 0))[1]
    plan = lim.pick(candidates, [(KEY, s) for s in slot_ids[:wanted]], [], idle_threads=8, limit=limit)
    lim.claimed(plan, set(plan.ids))
    return plan.ids


def run(lim: Limiter, job_id: int) -> None:
    assert lim.acquire(job_id, timeout=5.0)


def test_a_worker_whose_claims_find_no_more_jobs_of_a_limit_gives_its_free_slots_back():
    lim = limiter()
    # Three slots, six candidates: three run, three wait, the rest left in
    # the table ("more" of the limit for this worker).
    taken = claim(lim, rows(*range(1, 10)), [101, 102, 103])
    assert taken == [1, 2, 3, 4, 5, 6]
    for job in taken:
        if job <= 3:
            run(lim, job)
    for job in taken:
        if job > 3:
            lim.finished(job)  # handed back unrun (a lost shard): no longer waits here
    for job in (1, 2, 3):
        lim.finished(job)
    assert lim.take_released() == []  # kept: the table had more of its jobs for this worker
    assert lim.owned() == 3
    # The next claim's walk finds none of them (another worker's shards hold
    # the rest): the slots go back, for that worker.
    assert claim(lim, [], []) == []
    assert sorted(lim.take_released()) == [101, 102, 103]
    assert lim.owned() == 0


def test_a_slot_is_kept_only_for_a_job_waiting_here_even_with_a_thread_queued_for_it():
    lim = limiter()
    taken = claim(lim, rows(1, 2, 3, 4), [101, 102, 103])
    assert taken == [1, 2, 3, 4]  # no more in the table
    for job in (1, 2, 3):
        run(lim, job)
    # Job 4's thread waits for a slot; two jobs end before or after it
    # takes one: whichever, one slot is surplus and goes back.
    waiter = threading.Thread(target=run, args=(lim, 4))
    waiter.start()
    wait_until(lambda: lim.waiting_threads(KEY) == 1, message="job 4's thread queued for a slot")
    lim.finished(1)
    lim.finished(2)
    waiter.join(timeout=5)
    assert not waiter.is_alive()
    assert len(lim.take_released()) == 1
    assert lim.owned() == 2  # job 3's and job 4's
    lim.finished(3)
    lim.finished(4)
    assert len(lim.take_released()) == 2
    assert lim.owned() == 0


@pytest.mark.parametrize("during_claim", [True, False])
def test_a_slot_freed_elsewhere_while_a_claim_runs_is_looked_for_by_the_next_claim(during_claim):
    lim = limiter()
    claim(lim, rows(1, 2), [101])  # one slot of three: two jobs (one runs, one waits), the rest elsewhere
    # A claim whose walk finds more jobs but no slot in the table: the limit is full for now.
    lim.full_keys()
    candidates = rows(3, 4, 5)
    lim.walked(candidates, [])
    lim.needs(candidates, 10)
    if during_claim:
        lim.freed(KEY)  # another worker's release NOTIFY, between the walk and the pick
    plan = lim.pick(candidates, [], [], idle_threads=8, limit=10)
    lim.claimed(plan, set(plan.ids))
    assert plan.ids == []
    # Full (passed over by the next walks) only when no slot was freed meanwhile.
    assert (KEY in lim.full_keys()) is not during_claim


def test_jobs_ending_while_a_claim_runs_leave_its_room_owned_until_the_claim_registers_its_jobs():
    """The claim's room counted the slots its running jobs held; they end
    between the pick and the registration of the claimed jobs (``claimed``).
    The slots went back then (no job of the limit waited here yet), and the
    claimed jobs found none: handed back, and the drain's last jobs waited
    out the poll (bench/limits.py's generous case, 1 run in 5). A claim is
    bracketed (claim_begun / claim_ended, as Fetcher.claim_limited does)."""
    lim = limiter()
    assert claim(lim, rows(1, 2, 3), [101, 102, 103]) == [1, 2, 3]
    for job in (1, 2, 3):
        run(lim, job)
    lim.claim_begun()
    lim.full_keys()
    candidates = rows(4, 5)
    lim.walked(candidates, [])
    lim.needs(candidates, 10)
    plan = lim.pick(candidates, [], [], idle_threads=8, limit=10)
    assert plan.ids == [4, 5]  # into the slots jobs 1-3 still hold
    for job in (1, 2, 3):
        lim.finished(job)
    lim.claimed(plan, set(plan.ids))
    lim.claim_ended()
    assert lim.acquire(4, timeout=1.0) and lim.acquire(5, timeout=1.0)
    assert len(lim.take_released()) == 1  # the third slot: nothing here needs it
