"""The worker's side of concurrency and rate limits (docs/limits.md).

A worker *owns* slots of a concurrency limit (rows of ``shardq_limit_slot``
under its id) and lends them to its threads: a limited job runs only while
its thread holds one of this worker's slots of each of its limits
(``acquire``, in sorted key order). So at every instant, cluster-wide,

    jobs running under limit k  <=  slots of k owned  <=  max_concurrency of k

because a slot row is owned by one worker at a time (taken SKIP LOCKED in
the claim's transaction, only ``slot < cap``).

State model of a slot row::

    free --(limited claim, same transaction as its jobs' claim)--> owned(worker, expires)
    owned --(heartbeat: renewed while this worker owns it)--> owned, expires = now + LEASE_TTL
    owned --(this worker has no job of k waiting, or owns more than it may keep)--> free (+ NOTIFY)
    owned --(the worker died: no renewal)--> free once expires passes (anyone may take it)

Owned slots pass from a finished job to the next claimed job of the same
limit in memory, with no statement: a worker claims a few jobs of a limit
per slot it owns (``_room``), so a job waits in its buffer for the slot of
one that runs (look-ahead, as unlimited jobs have) instead of a claim round
trip after every job. A worker owns at most ``min(cap, --concurrency)``
slots of a limit (``_share``), so a limit of 40 over 4 workers of 10
threads is 10 + 10 + 10 + 10 even when one worker started first (River's
case), and a limit of 3 can run 3 on one worker when the others have no
jobs of it; a free slot is kept only for a job of the limit waiting here
(``_release_idle``).

A dead worker's slots come back at most LEASE_TTL after its last renewal
(renewals come every HEARTBEAT / 2); a thread that outlives its job's
outcome (a zombie) keeps its slot until it really ends, since the slot is
the thread's, not the outcome's.

Rate limits are GCRA rows debited in the claim's transaction, in sorted
key order, by as many tokens as the claim takes; rate-limited jobs are only
claimed for idle threads, so they start when their token is spent.
"""

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.tasks import Task

from ..conf import Config
from ..core.limits import LimitSpec, assign, grant, next_token_in
from ..db.store import WorkerStore
from ..exceptions import UnknownTask
from ..limits import spec_for_key, task_spec
from ..tasks import registered_task_paths, resolve

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger("shardq.worker.limits")

# A limited claim locks at most this many candidates per wanted job (jobs
# of full limits are passed over by the walk, not locked).
SCAN_FACTOR = 1.5
# Claimed jobs of a limit per slot this worker owns: one runs, one waits in
# memory to take the slot the moment it is free (the look-ahead that hides
# the claim's round trip). A waiting job may hold a thread while it waits
# (acquire), so at most one thread per owned slot waits.
QUEUED_PER_SLOT = 2
QUEUED_PER_SLOT_ALL_THREADS = 4
# When the limit has all the worker's threads: up to this many per slot,
# LOOKAHEAD_SECONDS of work at the measured task time.
MAX_QUEUED_PER_SLOT = 256
LOOKAHEAD_SECONDS = 0.05  # as the unlimited demand's (Worker.demand)


@dataclass(slots=True)
class LimitPlan:
    """What one limited claim decided (``Limiter.pick``), for ``claim_limited_jobs``."""

    ids: list[int] = field(default_factory=list)
    # Slot rows this claim takes (ids), and the key of each.
    slot_ids: list[int] = field(default_factory=list)
    slot_keys: list[str] = field(default_factory=list)
    rate_keys: list[str] = field(default_factory=list)
    rate_tats: list[float] = field(default_factory=list)
    # job id -> the concurrency keys it must hold a slot of to run
    keys: dict[int, list[str]] = field(default_factory=dict)


class Limiter:
    """Decides the limited claims of one worker and keeps its slots."""

    def __init__(
        self,
        *,
        worker_id: str,
        queue_limits: dict[str, LimitSpec],
        settings: Config,
        concurrency: int = 1,
        task_seconds: Callable[[], float | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.queue_limits = queue_limits
        self.task_modules = tuple(settings.task_modules)
        self.ttl = settings.lease_ttl_seconds
        self.heartbeat = settings.heartbeat_seconds
        self.poll_interval = settings.poll_interval_seconds
        self.concurrency = concurrency
        # () -> the executors' average task time (None: none measured yet)
        self.task_seconds = task_seconds
        self.clock = clock
        # One lock (a condition: threads wait on it for a slot) over all
        # the state below.
        self._cond = threading.Condition()
        # key -> slot row ids this worker owns and no thread holds
        self._free: dict[str, list[int]] = {}
        # key -> slots of it held by threads
        self._in_use: dict[str, int] = {}
        # job id -> its concurrency keys (claimed here, not finished)
        self._jobs: dict[int, list[str]] = {}
        # job id -> the slot ids its thread holds
        self._held: dict[int, list[tuple[str, int]]] = {}
        # key -> claimed jobs of it not yet holding slots (waiting in memory)
        self._waiting: dict[str, int] = {}
        self._caps: dict[str, int] = {}
        # key -> job ids whose threads wait for a slot of it, in arrival order
        self._queue: dict[str, deque[int]] = {}
        # key -> the last limited claim left jobs of it in the table (more
        # may come: keep its slots while idle)
        self._more: dict[str, bool] = {}
        self._released: list[int] = []
        # Limits found full, passed over by the next walks until the time
        # given (a freed slot's NOTIFY or the poll for concurrency, the next
        # token for a rate).
        self._full: dict[str, float] = {}
        # Limits a NOTIFY said had a slot freed since the current claim's walk began.
        self._freed_since_walk: set[str] = set()
        # When the last full claim began, and whether a NOTIFY asked for one since.
        self._last_full_claim = -1e18
        self._look_again = False
        self._ensured_slots: set[tuple[str, int]] = set()
        self._ensured_rates: set[str] = set()
        self._last_renew = -1e18
        self._renew_now = False
        self._known_paths = -1
        self._active = bool(queue_limits)
        self._stopping = False
        # A limited claim is between its room (owned_rooms, the walk) and its
        # jobs' registration (claimed, claimed_owned): no free slot goes back
        # meanwhile (see claim_begun).
        self._claiming = False

    # -- is anything limited at all? --------------------------------------------

    def active(self) -> bool:
        """Does any limit exist in this process (queue settings, or a task
        defined with one)? A worker without limits never runs a limited
        statement: no cost to those who do not use them."""
        if self._active:
            return True
        paths = registered_task_paths()
        if len(paths) != self._known_paths:
            self._known_paths = len(paths)
            self._active = any(task_spec(self._resolve(p)) is not None for p in paths)
        return self._active

    def _resolve(self, path: str) -> Task | None:
        try:
            return resolve(path, self.task_modules)
        except UnknownTask:
            return None

    def spec(self, key: str) -> LimitSpec | None:
        if not isinstance(key, str):
            # No limit known here (a row written by hand: the claim's walk
            # quarantines it, see job_problem; this is the guard behind it).
            return None
        return spec_for_key(key, self._resolve, self.queue_limits)

    def _share(self, key: str) -> int:
        """How many slots of ``key`` this worker may own: as many as it can
        run at once (its threads), never more than the cap. A slot beyond
        the threads runs nothing here and is one another worker's thread
        could run with: a worker that started first took all 40 slots of
        River's case (its share then counted it alone) and ran 10, while the
        other three waited for its jobs to end to get theirs."""
        return min(self._caps.get(key, 1), self.concurrency)

    def _owned(self, key: str) -> int:
        return len(self._free.get(key, ())) + self._in_use.get(key, 0)

    # -- the claim ----------------------------------------------------------------

    def full_keys(self) -> list[str]:
        """The limits a claim starting now passes over (known to be full)."""
        now = self.clock()
        with self._cond:
            # Slots freed from here on are seen by this claim's pick (below).
            self._freed_since_walk.clear()
            self._last_full_claim = now
            self._look_again = False
            for key in [k for k, until in self._full.items() if until <= now]:
                del self._full[key]
            return sorted(self._full)

    def claim[R: "DataclassInstance"](
        self,
        store: WorkerStore,
        *,
        worker: str,
        shards: list[int],
        pool: str,
        queues: list[str] | None,
        exclude_queues: list[str] | None,
        backend: str | None,
        per_shard: int,
        scan: int,
        idle_threads: int,
        ttl: float,
        row_factory: type[R],
        limit: int,
    ) -> tuple[list[R], LimitPlan | None]:
        """One full limited claim, one transaction (``store.limited_claim``):
        lock the candidates, the free slots (SKIP LOCKED) and the rate rows
        (sorted), ``pick`` (at most ``limit`` jobs), then write slots, tokens
        and claims together. The jobs limited by rates alone are started by
        this claim (``rate_only``). Returns the claimed jobs (``row_factory``
        rows) and the plan (None: no candidate)."""
        full = self.full_keys()
        new_slots: dict[str, int] = {}
        new_rates: list[str] = []
        with store.limited_claim() as tx:
            rows = tx.candidates(
                worker=worker,
                shards=shards,
                pool=pool,
                queues=queues,
                exclude_queues=exclude_queues,
                backend=backend,
                per_shard=per_shard,
                scan=scan,
                full=full,
            )
            # Candidates the walk found unreadable (job_problem) never reach
            # the policy: the claim's write quarantines them, and they come
            # back with ``problem`` set.
            unreadable = [row for row in rows if row["problem"] is not None]
            if unreadable:
                rows = [row for row in rows if row["problem"] is None]
            self.walked(rows, full)
            if not rows and not unreadable:
                return [], None
            slots, rates = self.needs(rows, limit)
            new_slots = self.new_slot_keys(slots)
            new_rates = self.new_rate_keys(rates)
            if new_slots:
                tx.ensure_slots(new_slots)
            if new_rates:
                tx.ensure_rates(new_rates)
            # Only limits that want more slots: in a steady state a worker's
            # owned slots serve its claims with no statement.
            wanted = {k: v for k, v in slots.items() if v[1] > 0}
            slot_rows = tx.take_slots(wanted) if wanted else []
            rate_rows = tx.lock_rates(rates) if rates else []
            plan = self.pick(rows, slot_rows, rate_rows, idle_threads, limit)
            if not plan.ids:
                # Nothing to claim: the slots locked are not taken.
                plan.slot_ids.clear()
                plan.slot_keys.clear()
            if not plan.ids and not unreadable:
                claimed: list[R] = []  # the claim statement that would write them does not run
            else:
                claimed = tx.claim(
                    worker=worker,
                    pool=pool,
                    ids=plan.ids + [row["id"] for row in unreadable],
                    start_ids=self.rate_only(rows, plan.ids),
                    problems=[None] * len(plan.ids) + [row["problem"] for row in unreadable],
                    slot_ids=plan.slot_ids,
                    rate_keys=plan.rate_keys,
                    rate_tats=plan.rate_tats,
                    ttl=ttl,
                    row_factory=row_factory,
                )
        # Committed: the rows ensured exist for good.
        self.slots_ensured(new_slots)
        self.rates_ensured(new_rates)
        return claimed, plan

    def rate_only(self, rows: Sequence[dict[str, Any]], ids: list[int]) -> list[int]:
        """Of the picked ``ids``, the jobs limited by rates alone. A rate
        token is spent by the claim, and rate-limited jobs are claimed only
        for threads idle now (``pick``), so the claim is these jobs' start
        write, for threads that begin them at once: their start is their
        token's time, and a rate limit holds on starts. Started by their
        threads instead, a start write's latency after the token (a round
        trip, more on a loaded machine) bunched them: 23 starts in a second
        of a 20/s limit (burst 2) across three workers."""
        picked = set(ids)
        found = []
        for row in rows:
            if row["id"] not in picked or not row["limit_keys"]:
                continue
            specs = [self.spec(key) for key in row["limit_keys"]]
            if all(spec is not None and spec.max_concurrency is None and spec.rate is not None for spec in specs):
                found.append(row["id"])
        return found

    def wake_in(self) -> float | None:
        """Seconds until a limit passed over may have room again (None: none is)."""
        with self._cond:
            if not self._full:
                return None
            return max(0.0, min(self._full.values()) - self.clock())

    def freed(self, key: str) -> bool:
        """A NOTIFY said a slot of ``key`` was freed somewhere: look again.
        True when this worker was passing that limit over, or its last claim
        left jobs of it in the table (wake the fetcher)."""
        with self._cond:
            self._freed_since_walk.add(key)
            self._look_again = True
            passed_over = self._full.pop(key, None) is not None
            return passed_over or bool(self._more.get(key))

    def needs(
        self, rows: Sequence[dict[str, Any]], limit: int | None = None
    ) -> tuple[dict[str, tuple[int, int]], list[str]]:
        """For candidate rows (a claim of at most ``limit``): {concurrency
        key: (cap, slots to take from the table)} and the rate keys, both
        sorted (the lock order)."""
        counts: dict[str, int] = {}
        caps: dict[str, int] = {}
        rates = set()
        for row in rows:
            for key in row["limit_keys"] or ():
                spec = self.spec(key)
                if spec is None:
                    continue
                if spec.max_concurrency is not None:
                    caps[key] = spec.max_concurrency
                    counts[key] = counts.get(key, 0) + 1
                if spec.rate is not None:
                    rates.add(key)
        slots = {}
        with self._cond:
            self._caps.update(caps)
            for key in sorted(counts):
                # Up to what it may keep, and no more than the candidates
                # could use beyond the room it has.
                room = self._room(key)
                count = counts[key] if limit is None else min(limit, counts[key])
                wanted = min(self._share(key) - self._owned(key), max(0, count - room))
                slots[key] = (caps[key], max(0, min(wanted, caps[key])))
        return slots, sorted(rates)

    def _room(self, key: str, new: int = 0) -> int:
        """Jobs of ``key`` this worker may still claim: up to QUEUED_PER_SLOT
        per slot it owns, running or waiting (none without a slot: a job
        claimed here must not wait for slots other workers hold)."""
        owned = self._owned(key) + new
        busy = self._in_use.get(key, 0) + self._waiting.get(key, 0)
        # A waiting job may hold a thread while it waits (acquire): one per
        # slot at most, unless this worker's threads are all the limit's
        # anyway (owned >= concurrency), when a deeper queue costs no thread
        # another task could use and hides a longer claim: then as deep as
        # the unlimited look-ahead (LOOKAHEAD_SECONDS of the measured task
        # time), so short tasks are claimed in batches, not a claim (3-5
        # statements) every few jobs.
        per_slot = QUEUED_PER_SLOT
        if owned >= self.concurrency:
            per_slot = QUEUED_PER_SLOT_ALL_THREADS
            seconds = self.task_seconds()
            if seconds is not None:
                # One running and the look-ahead's waiting: the worker's
                # demand (concurrency + look-ahead) in all, so a claim comes
                # when a demand batch is free and has room for all of it (with
                # fewer, 10 ms tasks were claimed 5 at a time).
                ahead = math.ceil(LOOKAHEAD_SECONDS / max(seconds, 1e-6))
                per_slot = max(per_slot, min(MAX_QUEUED_PER_SLOT, 1 + ahead))
        return max(0, owned * per_slot - busy)

    def new_slot_keys(self, slots: dict[str, tuple[int, int]]) -> dict[str, int]:
        """The (key, cap) pairs whose slot rows this process has not made sure of yet."""
        return {k: cap for k, (cap, _) in slots.items() if (k, cap) not in self._ensured_slots}

    def slots_ensured(self, keys: dict[str, int]) -> None:
        self._ensured_slots.update(keys.items())

    def new_rate_keys(self, keys: list[str]) -> list[str]:
        return [k for k in keys if k not in self._ensured_rates]

    def rates_ensured(self, keys: list[str]) -> None:
        self._ensured_rates.update(keys)

    def pick(
        self,
        rows: Sequence[dict[str, Any]],
        slot_rows: Sequence[tuple[str, int]],
        rate_rows: Sequence[dict[str, Any]],
        idle_threads: int,
        limit: int | None = None,
    ) -> LimitPlan:
        """Choose, in claim order, at most ``limit`` candidates every limit has room for:
        a concurrency key's room is ``_room`` with the slots this claim
        took; a rate key's the tokens GCRA grants now, and only for idle
        threads (a rate token is spent on a job that starts at once)."""
        new_slots: dict[str, list[int]] = {}
        for key, slot_id in slot_rows:
            new_slots.setdefault(key, []).append(slot_id)
        specs = {key: self.spec(key) for row in rows for key in row["limit_keys"] or ()}
        room: dict[str, int] = {}
        with self._cond:
            for key, spec in specs.items():
                if spec is not None and spec.max_concurrency is not None:
                    room[key] = self._room(key, len(new_slots.get(key, ())))
        rates = {}
        for rate_row in rate_rows:
            key = rate_row["limit_key"]
            spec = specs.get(key)
            if spec is None or spec.rate is None:
                continue
            wanted = min(max(0, idle_threads), sum(1 for row in rows if key in (row["limit_keys"] or ())))
            granted, _ = grant(rate_row["tat"], rate_row["now"], spec.rate, wanted)
            rates[key] = (rate_row["tat"], rate_row["now"], spec.rate)
            room[key] = min(room.get(key, granted), granted)
        jobs = [(row["id"], [k for k in row["limit_keys"] or () if k in room]) for row in rows]
        taken, used = assign(jobs, room, limit)
        plan = LimitPlan()
        taken_set = set(taken)
        for job_id, keys in jobs:
            if job_id in taken_set:
                plan.ids.append(job_id)
                plan.keys[job_id] = [k for k in keys if k not in rates or (specs[k] or LimitSpec()).max_concurrency]
        for key, ids in new_slots.items():
            plan.slot_ids.extend(ids)
            plan.slot_keys.extend([key] * len(ids))
        now_mono = self.clock()
        full: dict[str, float] = {}
        denied = {k for job_id, keys in jobs if job_id not in taken_set for k in keys}
        with self._cond:
            for key in room:
                self._more[key] = key in denied
        for key, (tat, now, rate) in sorted(rates.items()):
            n = used.get(key, 0)
            _, new_tat = grant(tat, now, rate, n) if n else (0, tat)
            if n:
                plan.rate_keys.append(key)
                plan.rate_tats.append(new_tat)
            if key in denied:
                full[key] = now_mono + max(next_token_in(new_tat, now, rate), 0.001)
        for key in room:
            if key not in rates and key in denied and room[key] - used.get(key, 0) <= 0:
                # Looked at again when a NOTIFY says a slot was freed, or
                # after two polls. One poll was the full claim's own period
                # (full_claim_due), so the mark had lapsed by the next full
                # claim, whose walk (one candidate a shard for a small want)
                # met the same capped job first, every time: the other limited
                # jobs of its shard waited out the whole backlog (a capped
                # task's 30 jobs held two of another task for 4.3 s of 5).
                full[key] = now_mono + 2 * self.poll_interval
        with self._cond:
            # A slot freed while this claim ran (its NOTIFY came between the
            # walk and now) may be one take_limit_slots did not see: the
            # limit is not full for the next claim. (Marking it full here
            # undid the NOTIFY, and the slot sat free until the poll.)
            for key in self._freed_since_walk:
                full.pop(key, None)
            self._full.update(full)
        return plan

    # -- the one-statement claim, into owned slots ----------------------------------

    def owned_rooms(self) -> dict[str, int]:
        """{key: jobs it may still claim} of the concurrency limits (no rate)
        this worker owns slots of and has room in: what the one-statement
        claim (``claim_limited_owned``) may take with no slot to take and no
        token to spend. Empty: only the full claim can take anything."""
        rooms = {}
        with self._cond:
            for key in self._caps:
                if not self._owned(key):
                    continue
                spec = self.spec(key)
                if spec is None or spec.rate is not None or spec.max_concurrency is None:
                    continue
                room = self._room(key)
                if room > 0:
                    rooms[key] = room
        return rooms

    def claimed_owned(self, rows: Sequence[Any], rooms: dict[str, int], limit: int) -> None:
        """A one-statement claim committed ``rows`` (ClaimedJobs) with ``rooms``:
        its jobs wait here for the slots; a limit whose room it did not fill
        (nor the claim's ``limit``) has no more jobs for this worker now."""
        taken: dict[str, int] = {}
        with self._cond:
            for job in rows:
                keys = list(job.limit_keys or ())
                self._jobs[job.id] = keys
                for key in keys:
                    self._waiting[key] = self._waiting.get(key, 0) + 1
                    taken[key] = taken.get(key, 0) + 1
            for key, room in rooms.items():
                self._more[key] = taken.get(key, 0) >= room or len(rows) >= limit
            self._release_idle()
            self._cond.notify_all()

    def claim_begun(self) -> None:
        """A limited claim starts: keep every free slot until it ends. Its
        room counts them; a job leaving a thread meanwhile (``finished``)
        found no job of the limit waiting here yet, the claim's not being
        registered, and gave the slots back, so the claimed jobs found none
        and were handed back, and the drain's last jobs waited out the poll
        (1 run in 5 of bench/limits.py's generous case, a 1-second tail)."""
        with self._cond:
            self._claiming = True

    def claim_ended(self) -> None:
        """The limited claim ended (its jobs registered, or it failed): the
        free slots are decided again."""
        with self._cond:
            self._claiming = False
            self._release_idle()
            self._cond.notify_all()

    def full_claim_due(self) -> bool:
        """After a one-statement claim that came back short: is the full
        claim (candidates, slots, rates) worth its statements now? When a
        limit with jobs left could take more slots, when a NOTIFY said a
        slot was freed, or once a poll interval (new limits, rate limits)."""
        with self._cond:
            if self._look_again or self.clock() - self._last_full_claim >= self.poll_interval:
                return True
            # A limit with jobs left that the one-statement claim cannot
            # serve: a rate limit (its tokens are the full claim's), or one
            # this worker could own more slots of.
            return any(
                more and key not in self._full and (key in self._ensured_rates or self._owned(key) < self._share(key))
                for key, more in self._more.items()
            )

    def claimed(self, plan: LimitPlan, claimed_ids: set[int]) -> None:
        """The claim committed: its slots are this worker's, its jobs wait
        for them. (Slots taken for jobs the claim did not get stay owned
        and serve the next claim, or go back when nothing needs them.)"""
        with self._cond:
            for key, slot_id in zip(plan.slot_keys, plan.slot_ids, strict=True):
                self._free.setdefault(key, []).append(slot_id)
            for job_id, keys in plan.keys.items():
                if job_id in claimed_ids and keys:
                    self._jobs[job_id] = keys
                    for key in keys:
                        self._waiting[key] = self._waiting.get(key, 0) + 1
            self._release_idle()
            self._cond.notify_all()  # threads waiting for a slot: new ones came

    def _release_idle(self) -> None:
        """Give back the free slots nothing here will use (caller holds the
        lock). Called after every change of what a limit's slots are for
        (a claim, a walk, a job leaving a thread or this worker's memory),
        so a free slot never stays owned here on a decision taken before:
        an idle slot kept by one worker is one the others cannot run with.

        A worker keeps, of each limit, slots for the jobs of it running or
        waiting here, or up to its share while the table has more of its
        jobs for this worker (``_more``: its next claim takes them into the
        slot, with no release and take between); never more than its share.
        """
        if self._claiming:
            return  # decided again when the claim ends (claim_ended)
        for key, free in self._free.items():
            if not free:
                continue
            in_use = self._in_use.get(key, 0)
            share = self._share(key)
            wanted = share if self._more.get(key) else min(share, in_use + self._waiting.get(key, 0))
            while free and in_use + len(free) > wanted:
                self._released.append(free.pop())

    def walked(self, rows: Sequence[dict[str, Any]], passed_over: Sequence[str]) -> None:
        """A limited claim's walk found ``rows`` (``passed_over``: the keys it
        skipped as full). A limit none of them carries, not passed over, has
        no job for this worker's claims now: its slots are kept only for the
        jobs here. Without this, a worker whose shards ran out of a limit's
        jobs kept its free slots for good (its claims found no candidate, so
        nothing decided again), while another worker ran one at a time."""
        seen = {key for row in rows for key in row["limit_keys"] or ()}
        skipped = set(passed_over)
        with self._cond:
            for key in self._more:
                if key not in seen and key not in skipped:
                    self._more[key] = False
            self._release_idle()

    # -- threads ------------------------------------------------------------------

    def tracks(self, job_id: int) -> bool:
        """Is this a limited job of this worker's (claimed by a limited
        claim)? No lock: one dict lookup, atomic under the GIL, and a job is
        registered before any thread can take it. The executor asks this
        first, so an unlimited job costs no lock of the limiter's."""
        return job_id in self._jobs

    def acquire(self, job_id: int, timeout: float) -> bool:
        """Block this executor thread until it holds one of this worker's
        slots of each of the job's limits (sorted order: two threads never
        wait on each other). False after ``timeout`` (the job goes back)."""
        deadline = self.clock() + timeout
        with self._cond:
            keys = self._jobs.get(job_id)
            if not keys:
                return True
            # First come, first served per limit: threads take jobs in claim
            # order (the starter's priority order), and a job keeps its
            # place among the ones waiting for the same slots.
            for key in keys:
                self._queue.setdefault(key, deque()).append(job_id)
            try:
                while not all(self._free.get(k) and self._queue[k][0] == job_id for k in keys):
                    left = deadline - self.clock()
                    if not all(self._owned(k) for k in keys):
                        # This worker owns no slot of one of its limits: none
                        # will come back here without a claim. Hand the job
                        # back now (READY, nothing counted) rather than hold
                        # a thread for a lease.
                        return False
                    if left <= 0 or self._stopping:
                        if not self._stopping:
                            logger.warning(
                                "job %s waited %.0fs for a slot of %s (owned here: %s free, %s in use; "
                                "%s waiting; share %s, more %s); handing it back",
                                job_id,
                                timeout,
                                keys,
                                [len(self._free.get(k, ())) for k in keys],
                                [self._in_use.get(k, 0) for k in keys],
                                [self._waiting.get(k, 0) for k in keys],
                                [self._share(k) for k in keys],
                                [self._more.get(k) for k in keys],
                            )
                        return False
                    self._cond.wait(min(left, 0.5))
            finally:
                for key in keys:
                    self._queue[key].remove(job_id)
                self._cond.notify_all()
            held = []
            for key in keys:
                held.append((key, self._free[key].pop()))
                self._in_use[key] = self._in_use.get(key, 0) + 1
                self._waiting[key] = max(0, self._waiting.get(key, 1) - 1)
            self._held[job_id] = held
            return True

    def waiting_threads(self, key: str) -> int:
        """Executor threads waiting here for a slot of ``key`` (a test's view)."""
        with self._cond:
            return len(self._queue.get(key, ()))

    def stop_waiting(self) -> None:
        """Shutdown: threads waiting for a slot give their jobs back now
        rather than wait out the grace period."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def finished(self, job_id: int) -> bool:
        """An executor thread left this job (it ran, failed, or was handed
        back). Its slots pass to a job of the same limit waiting here, or
        go back to the table when none waits or this worker owns more than
        it may keep. True for a limited job: the caller wakes the fetcher,
        which writes the releases and claims into the room this made (it
        would otherwise sleep until its poll: a limited claim's room is
        not the demand that wakes it for unlimited jobs)."""
        with self._cond:
            keys = self._jobs.pop(job_id, None)
            held = self._held.pop(job_id, None)
            if keys is None:
                return False
            for key in keys:
                # Room opened here: the next claim looks at this limit again.
                self._full.pop(key, None)
            if held is None:  # never ran here: it no longer waits
                for key in keys:
                    self._waiting[key] = max(0, self._waiting.get(key, 1) - 1)
                self._release_idle()
                return True
            for key, slot_id in held:
                # Kept for a job waiting for it (a thread queued for a slot
                # is one of them), within what this worker may keep; given
                # back otherwise (_release_idle decides for every free slot
                # of the limit, not only this one).
                self._in_use[key] -= 1
                self._free.setdefault(key, []).append(slot_id)
            self._release_idle()
            self._cond.notify_all()
            return True

    # -- the table ------------------------------------------------------------------

    def take_released(self) -> list[int]:
        with self._cond:
            if self._released:
                logger.debug("releasing %s", self._released)
            released, self._released = self._released, []
            return released

    def renew_due(self) -> bool:
        if self._renew_now:
            return True
        return self.owned() > 0 and self.clock() - self._last_renew >= self.heartbeat / 2

    def requeue_renewal(self) -> None:
        """A release or renewal was not written: renew at the next round,
        which frees every slot of this worker not owned here any more."""
        self._renew_now = True

    def forget_gone(self, holds: Callable[[int], bool]) -> None:
        """Claimed jobs that left this worker's memory without a thread
        (handed back with a shard being released or lost, or at shutdown)
        no longer wait here: their room and slots are free again. Called
        by the fetcher before each claim, on the thread that puts claimed
        jobs into memory (so none is seen between claim and buffer)."""
        with self._cond:
            waiting = {j for queue in self._queue.values() for j in queue}
            gone = [j for j in self._jobs if j not in self._held and j not in waiting and not holds(j)]
            for job_id in gone:
                for key in self._jobs.pop(job_id):
                    self._full.pop(key, None)
            # Counted again from the jobs themselves once a round: the
            # per-job counts kept between rounds can never drift for long.
            counts: dict[str, int] = {}
            for job_id, keys in self._jobs.items():
                if job_id not in self._held:
                    for key in keys:
                        counts[key] = counts.get(key, 0) + 1
            self._waiting = counts
            self._release_idle()

    def to_renew(self, holds: Callable[[int], bool]) -> list[int]:
        """The slot ids to keep. Jobs no longer in this worker's memory
        (dropped with a lost shard, handed back) stop waiting here first."""
        self._last_renew = self.clock()
        self._renew_now = False
        self.forget_gone(holds)
        with self._cond:
            self._released.clear()  # the renewal frees whatever it does not keep
            owned = [slot for free in self._free.values() for slot in free]
            owned += [slot for held in self._held.values() for _, slot in held]
            return owned

    def owned(self) -> int:
        with self._cond:
            return sum(len(f) for f in self._free.values()) + sum(self._in_use.values())

    def holding(self) -> int:
        return self.owned()
