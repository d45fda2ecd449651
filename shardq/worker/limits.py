"""The worker's side of concurrency and rate limits (docs/limits.md).

State model of a concurrency slot (a row of ``shardq_limit_slot``)::

    free --(limited claim: SKIP LOCKED, same transaction as the job's claim)--> held(worker, job, expires)
    held --(heartbeat: the job is still in this worker's memory)--> held, expires = now + LEASE_TTL
    held --(the job's thread ended, or the job went back unrun)--> free   (release_limit_slots + NOTIFY)
    held --(the worker died or stopped renewing: expires passes)--> free  (takeable by anyone)

So a dead worker's slots come back at most LEASE_TTL after its last renewal
(renewals come every HEARTBEAT), and a thread that outlives its job's
outcome (a zombie: a timeout wrote the outcome, the thread runs on) keeps
its slot, because the release is the thread's own exit, not the outcome.

Rate limits are GCRA rows debited in the same transaction, in sorted key
order, by as many tokens as the claim takes (a batch, not one per job).

Everything here runs on the fetcher's thread, except ``finished`` (an
executor thread) and ``freed`` (the listener), which only touch
lock-protected sets.
"""

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.tasks import Task

from ..core.limits import LimitSpec, assign, grant, next_token_in
from ..exceptions import UnknownTask
from ..limits import spec_for_key, task_spec
from ..tasks import registered_task_paths, resolve

logger = logging.getLogger("shardq.worker.limits")

# A limited claim locks at most this many candidates per wanted job (jobs
# of full limits are passed over by the walk, not locked).
SCAN_FACTOR = 4


@dataclass(slots=True)
class LimitPlan:
    """What one limited claim decided (``Limiter.pick``), for ``claim_limited_jobs``."""

    ids: list[int] = field(default_factory=list)
    slot_ids: list[int] = field(default_factory=list)
    slot_jobs: list[int] = field(default_factory=list)
    rate_keys: list[str] = field(default_factory=list)
    rate_tats: list[float] = field(default_factory=list)
    # job id -> the concurrency keys whose slots it now holds
    holds: dict[int, list[str]] = field(default_factory=dict)


class Limiter:
    """Decides the limited claims of one worker and keeps its slots."""

    def __init__(
        self,
        *,
        worker_id: str,
        queue_limits: dict[str, LimitSpec],
        task_modules: tuple = (),
        lease_ttl_seconds: float,
        heartbeat_seconds: float,
        poll_interval_seconds: float,
        live_workers: Callable[[], int] = lambda: 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.queue_limits = queue_limits
        self.task_modules = task_modules
        self.ttl = lease_ttl_seconds
        self.heartbeat = heartbeat_seconds
        self.poll_interval = poll_interval_seconds
        self.live_workers = live_workers
        self.clock = clock
        self._lock = threading.Lock()
        # job id -> concurrency keys whose slots it holds (claimed here, thread not ended)
        self.book: dict[int, list[str]] = {}
        self._released: list[int] = []
        # Limits found full, passed over by the next walks until the time
        # given (a freed slot's NOTIFY or the poll for concurrency, the next
        # token for a rate).
        self._full: dict[str, float] = {}
        self._ensured_slots: set[tuple[str, int]] = set()
        self._ensured_rates: set[str] = set()
        self._last_renew = -1e18
        self._renew_now = False
        self._known_paths = -1
        self._active = bool(queue_limits)
        self.stats = {"limited_claims": 0, "limit_blocked": 0}

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
        return spec_for_key(key, self._resolve, self.queue_limits)

    # -- the claim ----------------------------------------------------------------

    def full_keys(self) -> list[str]:
        now = self.clock()
        with self._lock:
            for key in [k for k, until in self._full.items() if until <= now]:
                del self._full[key]
            return sorted(self._full)

    def wake_in(self) -> float | None:
        """Seconds until a limit passed over may have room again (None: none is)."""
        with self._lock:
            if not self._full:
                return None
            return max(0.0, min(self._full.values()) - self.clock())

    def freed(self, key: str) -> bool:
        """A NOTIFY said a slot of ``key`` was freed somewhere: look again.
        True when this worker was passing that limit over."""
        with self._lock:
            return self._full.pop(key, None) is not None

    def needs(self, rows: Sequence[dict[str, Any]]) -> tuple[dict[str, tuple[int, int]], list[str]]:
        """For candidate rows: {concurrency key: (cap, jobs wanting it)} and the rate keys, sorted."""
        slots: dict[str, tuple[int, int]] = {}
        rates = set()
        for row in rows:
            for key in row["limit_keys"] or ():
                spec = self.spec(key)
                if spec is None:
                    continue
                if spec.max_concurrency is not None:
                    cap, n = slots.get(key, (spec.max_concurrency, 0))
                    slots[key] = (cap, n + 1)
                if spec.rate is not None:
                    rates.add(key)
        return dict(sorted(slots.items())), sorted(rates)

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
    ) -> LimitPlan:
        """Choose, in claim order, the candidates every limit has room for.

        Room of a concurrency key: the free slots the claim locked; of a
        rate key: the tokens GCRA grants now. Beyond this worker's idle
        threads (jobs that would wait in its memory, holding slots another
        worker could use now), a job is taken only within this worker's
        fair share of each of its concurrency limits, ceil(cap / live
        workers): so a limit of 40 over 4 workers is spread 10 + 10 + 10 +
        10 rather than filling one worker's look-ahead (River's case). Rate
        tokens are only spent on jobs that start at once."""
        free_slots: dict[str, list[int]] = {}
        for key, slot_id in slot_rows:
            free_slots.setdefault(key, []).append(slot_id)
        specs = {key: self.spec(key) for row in rows for key in row["limit_keys"] or ()}
        room: dict[str, int] = {}
        for key, spec in specs.items():
            if spec is not None and spec.max_concurrency is not None:
                room[key] = len(free_slots.get(key, ()))
        rates = {}
        for rate_row in rate_rows:
            key = rate_row["limit_key"]
            spec = specs.get(key)
            if spec is None or spec.rate is None:
                continue
            wanted = sum(1 for row in rows if key in (row["limit_keys"] or ()))
            granted, _ = grant(rate_row["tat"], rate_row["now"], spec.rate, wanted)
            rates[key] = (rate_row["tat"], rate_row["now"], spec.rate)
            room[key] = min(room.get(key, granted), granted)
        live = max(1, self.live_workers())
        with self._lock:
            held: dict[str, int] = {}
            for keys in self.book.values():
                for key in keys:
                    held[key] = held.get(key, 0) + 1
        share = {
            key: -(-spec.max_concurrency // live) - held.get(key, 0)
            for key, spec in specs.items()
            if spec is not None and spec.max_concurrency is not None
        }
        # Keys a job may be limited by, in order, with the unknown ones left out.
        jobs = [(row["id"], [k for k in row["limit_keys"] or () if k in room]) for row in rows]
        ahead_room = dict(room)
        for key in room:
            if key in rates:
                ahead_room[key] = 0  # rate tokens: only for jobs that start now
            elif key in share:
                ahead_room[key] = min(room[key], max(0, share[key] - max(0, idle_threads)))
        now_jobs, used = assign(jobs[: max(0, idle_threads)] if idle_threads > 0 else [], room)
        left = {k: room[k] - used.get(k, 0) for k in room}
        started = set(now_jobs)
        rest = [j for j in jobs if j[0] not in started]
        ahead_left = {k: min(left[k], ahead_room[k]) for k in room}
        ahead_jobs, ahead_used = assign(
            [j for j in rest if all(k in ahead_left for k in j[1])] if rest else [], ahead_left
        )
        for k, n in ahead_used.items():
            used[k] = used.get(k, 0) + n
        taken = set(now_jobs) | set(ahead_jobs)
        plan = LimitPlan()
        keys_of = dict(jobs)
        for job_id, _ in jobs:
            if job_id not in taken:
                continue
            plan.ids.append(job_id)
            held_keys = []
            for key in keys_of[job_id]:
                if key in free_slots:
                    plan.slot_ids.append(free_slots[key].pop())
                    plan.slot_jobs.append(job_id)
                    held_keys.append(key)
            if held_keys:
                plan.holds[job_id] = held_keys
        now_mono = self.clock()
        full: dict[str, float] = {}
        for key, (tat, now, rate) in sorted(rates.items()):
            n = used.get(key, 0)
            _, new_tat = grant(tat, now, rate, n) if n else (0, tat)
            if n:
                plan.rate_keys.append(key)
                plan.rate_tats.append(new_tat)
            if any(key in keys_of[j] for j, _ in jobs if j not in taken):
                full[key] = now_mono + next_token_in(new_tat, now, rate)
        for key in room:
            if key in rates:
                continue
            denied = any(key in keys_of[j] for j, _ in jobs if j not in taken)
            if denied and room[key] - used.get(key, 0) <= 0:
                # Looked at again when a NOTIFY says a slot was freed, or at the poll.
                full[key] = now_mono + self.poll_interval
        if full:
            self.stats["limit_blocked"] += 1
            with self._lock:
                self._full.update(full)
        return plan

    def claimed(self, plan: LimitPlan, claimed_ids: set[int]) -> list[int]:
        """The claim committed: book the slots of the jobs it claimed. Slots
        given to jobs the claim did not get (moved meanwhile) are released."""
        self.stats["limited_claims"] += 1
        orphans = []
        with self._lock:
            for job_id, keys in plan.holds.items():
                if job_id in claimed_ids:
                    self.book[job_id] = keys
                else:
                    orphans.append(job_id)
            self._released.extend(orphans)
        return orphans

    # -- slots held ---------------------------------------------------------------

    def finished(self, job_id: int) -> bool:
        """An executor thread left this job (it ran, failed, or was handed
        back): its slots go back. True when it held any (the caller wakes
        the fetcher, which writes the release)."""
        with self._lock:
            if self.book.pop(job_id, None) is None:
                return False
            self._released.append(job_id)
            return True

    def take_released(self) -> list[int]:
        with self._lock:
            released, self._released = self._released, []
            return released

    def renew_due(self) -> bool:
        if self._renew_now:
            return True
        return bool(self.book) and self.clock() - self._last_renew >= self.heartbeat / 2

    def requeue_renewal(self) -> None:
        """A release or renewal was not written: renew at the next round,
        which frees every slot of this worker whose job is no longer here."""
        self._renew_now = True

    def to_renew(self, holds: Callable[[int], bool]) -> list[int]:
        """The jobs whose slots to keep: those still in this worker's memory.
        The rest (dropped with a lost shard, handed back) are forgotten here
        and freed by the renewal."""
        self._last_renew = self.clock()
        self._renew_now = False
        with self._lock:
            gone = [job_id for job_id in self.book if not holds(job_id)]
            for job_id in gone:
                del self.book[job_id]
            return list(self.book)

    def holding(self) -> int:
        with self._lock:
            return len(self.book)
