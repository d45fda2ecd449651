"""The pipeline object: what the worker's stages share, handed to each at construction.

The stages form one pipeline and data moves one way (DESIGN §5)::

    listener ─▶ fetcher ─▶ local queue ─▶ executors (start write, run) ─▶ completer
        (NOTIFY)   (claim)    (Buffer)        (StartWrites: group commit)   (acks)
                                  │                  ▲ queued acks ride on  │
                                  │                  └── the start write ───┘
                                  └──────── handback (jobs not run here) ◀─────┘

No stage calls an earlier one. What a stage needs to tell an earlier one
goes through this object: the executors free room (``slot_freed``), the
leaser gains shards (``shards_gained``), the listener reports new jobs
(the fetcher's own subscription), all by waking the fetcher here; the
completer reports outcomes written (``outcomes_written``), which wakes
whatever subscribed to that (the workflow resolver). What several stages
read lives here too: the local queue (buffered, processing), the measured
task time, the demand, the outcomes remembered for a recall, and the
optional features: limits (``limiter``) and metrics (``metrics``).

``PipelineConfig`` is the frozen configuration every service reads, built
once from ``settings.SHARDQ`` and the command's options (``WorkerOptions``)
and validated then (River's ``producerConfig.mustValidate``).
"""

import builtins
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

from ..conf import Config, get_config
from ..core import pools
from ..exceptions import ShardqConfigurationError
from ..fairness import FairBy, FairWeights
from ..limits import KeyCaps, queue_limits
from ..tasks import resolve
from .buffer import Buffer
from .handback import HandBack
from .jobs import ClaimedJob
from .limits import Limiter
from .remembered import RememberedOutcomes
from .stats import Stats
from .testsignal import PipelineSignals

if TYPE_CHECKING:
    from .metrics import Metrics

# Jobs buffered beyond the running ones cover this much of the threads' work
# at the measured task time (see Pipeline.demand).
LOOKAHEAD_SECONDS = 0.05
# A claim outside demand (Pipeline.outranking_claim) takes at most this many
# jobs; the buffer keeps OUTRANKING_ROOM places that only such claims fill.
OUTRANKING_BATCH = 16
OUTRANKING_ROOM = 64
DEFAULT_PREFETCH = 512
# With fair keys buffered, the look-ahead is at least this many jobs a thread.
FAIR_LOOKAHEAD = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """What ``manage.py shardq_worker`` is told for one worker process."""

    queues: list[str] | None = None
    exclude_queues: list[str] | None = None
    backend: str | None = pools.DEFAULT_BACKEND
    concurrency: int = 4
    grace: float = 30.0
    # The look-ahead (jobs claimed beyond the running ones) is at most this;
    # how much of it is used follows the measured task time.
    prefetch: int | None = None
    database: str = "default"
    # --max-tasks: stop gracefully once this many jobs finished here.
    max_tasks: int | None = None
    # --worker-id: shown next to the id in logs and shardq_status.
    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineConfig:
    """The one configuration of a worker's services (frozen: read, never changed)."""

    worker_id: str
    options: WorkerOptions
    settings: Config
    # Shards are leased per pool, the queue selection (DESIGN §4.8).
    pool: str
    max_prefetch: int
    # Started as one of N sibling processes (--processes N).
    expected_workers: int = 1

    @classmethod
    def build(cls, options: WorkerOptions, worker_id: str) -> "PipelineConfig":
        config = cls(
            worker_id=worker_id,
            options=options,
            settings=get_config(),
            pool=pools.pool_name(options.queues, options.exclude_queues, options.backend),
            max_prefetch=options.prefetch or DEFAULT_PREFETCH,
            expected_workers=int(os.environ.get("SHARDQ_EXPECTED_WORKERS", "1")),
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Refuse what no worker can run with, naming it (the command
        validates its flags first; this guards every other caller)."""
        options = self.options
        for name, value, least in (
            ("concurrency", options.concurrency, 1),
            ("prefetch", self.max_prefetch, 1),
            ("max_tasks", options.max_tasks if options.max_tasks is not None else 1, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ShardqConfigurationError(f"worker option {name} = {value!r}: give an int >= {least}")
        if not isinstance(options.grace, (int, float)) or isinstance(options.grace, bool) or not options.grace >= 0:
            raise ShardqConfigurationError(f"worker option grace = {options.grace!r}: give seconds >= 0")

    # Short names for what the services read most.
    @property
    def concurrency(self) -> int:
        return self.options.concurrency

    @property
    def database(self) -> str:
        return self.options.database

    @property
    def task_modules(self) -> tuple[str, ...]:
        return tuple(self.settings.task_modules)

    @property
    def lease_ttl_seconds(self) -> float:
        return self.settings.lease_ttl_seconds

    @property
    def limit_channel(self) -> str:
        return self.settings.channel + "_limit"


class Sink(Protocol):
    """A stage that still owes a write for jobs it holds (the completer)."""

    @property
    def pending(self) -> int: ...
    def pending_in_shard(self, shard: int) -> int: ...
    def holds(self, job_id: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class OutrankingClaim:
    """A claim outside demand (``Fetcher.claim_outranking``): up to ``limit``
    jobs of ``min_priority`` or more."""

    min_priority: int
    limit: int


class FetchWake:
    """What the fetcher sleeps on between claims: an event, plus why it was set.

    ``set()`` (free room, new shards, a control or a limit slot changed,
    anything but new jobs) asks for a claim over every held shard;
    ``notified(shard)`` only records that a NOTIFY told of new jobs in
    ``shard``, and ``wake()`` wakes the fetcher for those: while the last
    claim over every shard found nothing, it claims only the shards told of
    (``Fetcher.scope``), one index probe each instead of one per held shard.
    """

    __slots__ = ("_event", "_lock", "_full", "_shards")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._full = True
        self._shards: builtins.set[int] = builtins.set()

    def set(self) -> None:
        with self._lock:
            self._full = True
        self._event.set()

    def notified(self, shard: int) -> None:
        with self._lock:
            self._shards.add(shard)

    def want_full(self) -> None:
        """Ask for a claim over every shard, without waking the fetcher (a
        rate-limited wake follows)."""
        with self._lock:
            self._full = True

    def wake(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def take(self) -> tuple[bool, builtins.set[int]]:
        """(was a claim over every shard asked for, the shards NOTIFYs told
        of) since the last call."""
        with self._lock:
            full, shards = self._full, self._shards
            self._full, self._shards = False, builtins.set()
        return full, shards


class Pipeline:
    """What the stages share (see the module docstring)."""

    def __init__(
        self, config: PipelineConfig, stats: Stats, handback: HandBack, metrics: "Metrics | None" = None
    ) -> None:
        self.config = config
        self.stats = stats
        self.metrics = metrics  # None: metrics off
        # Claimed jobs that will not run here go back to READY through it.
        self.handback = handback
        # The fetcher sleeps on this between claims.
        self.fetch_wake = FetchWake()
        task_of = partial(resolve, extra_modules=config.task_modules)
        self.buffer = Buffer(
            config.concurrency + config.max_prefetch + OUTRANKING_ROOM,
            key_cap=KeyCaps(task_of),
            fair_weight=FairWeights(),
            fair_by_time=FairBy(task_of),
            # A fair key passed over by the claim ran low here: claim again.
            fair_room=self.fetch_wake.set,
        )
        # Outcomes refused under an earlier claim, for a recall (fetcher.py).
        self.remembered = RememberedOutcomes()
        # Concurrency and rate limits (docs/limits.md): active only when
        # this process defines some.
        self.limiter: Limiter | None = Limiter(
            worker_id=config.worker_id,
            queue_limits=queue_limits(),
            settings=config.settings,
            concurrency=config.concurrency,
            task_seconds=self.measured_task_seconds,
        )
        self._sinks: list[Sink] = []
        self._written: list[Callable[[], None]] = []
        self._suspended: list[Callable[[], None]] = []
        # Queues the fetcher leaves out for their concurrency override
        # (Fetcher.apply_controls): a job of one leaving wakes it.
        self.capped_blocked: frozenset[str] = frozenset()
        # Set by the fetcher when it waits for room (slot_freed wakes it).
        self.waiting_for_slots = False
        # The lowest priority of the ordinary claim in flight (None: none):
        # jobs on their way here, which a NOTIFY's priority must outrank.
        self.in_flight_lowest: int | None = None
        # Moving average of task run time (seconds); 10 ms until measured.
        self.average_task_seconds = 0.01
        self.task_measured = False
        # The stages' milestones, for tests to await (testsignal.py): off,
        # and free, unless a test turns them on.
        self.signals = PipelineSignals()

    # -- late binding, by name ---------------------------------------------------

    def add_sink(self, sink: Sink) -> None:
        """A stage that owes writes for jobs it holds (the completer)."""
        self._sinks.append(sink)

    def on_outcomes_written(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after outcomes of workflow parents landed."""
        self._written.append(callback)

    def on_suspended(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after an executor suspended a durable job (the waker)."""
        self._suspended.append(callback)

    # -- told by later stages ------------------------------------------------------

    def suspended(self) -> None:
        """A durable job was suspended here: the waker looks at its due time."""
        for callback in self._suspended:
            callback()

    def wake_fetch(self) -> None:
        self.fetch_wake.set()

    def slot_freed(self, queue_name: str | None = None) -> None:
        """A job (of ``queue_name``) left this worker: wake the fetcher if it
        waits for room, or for room in that queue's concurrency override."""
        if queue_name is not None and queue_name in self.capped_blocked:
            self.fetch_wake.set()
        if self.waiting_for_slots:
            wanted, min_batch = self.demand()
            if wanted < min_batch:
                return
            self.waiting_for_slots = False
            self.fetch_wake.set()

    def outcomes_written(self) -> None:
        for callback in self._written:
            callback()

    def task_ran(self, seconds: float) -> None:
        if self.task_measured:
            self.average_task_seconds += 0.05 * (seconds - self.average_task_seconds)
        else:
            self.average_task_seconds, self.task_measured = seconds, True

    def measured_task_seconds(self) -> float | None:
        """The average task time, or None before any task has finished."""
        return self.average_task_seconds if self.task_measured else None

    def shards_gained(self, shards: set[int]) -> None:
        """New shards: claim from them now rather than at the next poll."""
        self.fetch_wake.set()

    def shards_lost(self, shards: set[int]) -> None:
        """Self-fence or drain: forget the buffered jobs of these shards."""
        dropped: list[ClaimedJob] = []
        for shard in shards:
            dropped.extend(self.buffer.drop_shard(shard))
        self.handback.return_jobs(dropped)

    # -- read by the stages ----------------------------------------------------------

    def demand(self) -> tuple[int, int]:
        """(jobs to claim now, smallest batch worth a round trip).

        In flight = running + buffered, aimed at the concurrency plus enough
        buffered jobs to cover LOOKAHEAD_SECONDS of work at the measured task
        duration: a no-op task gets hundreds (a claim round trip is amortised),
        a one-second task gets one per thread (nothing waits in memory while
        another worker could run it).
        """
        concurrency = self.config.concurrency
        target = concurrency + self.lookahead_jobs()
        buffer = self.buffer
        # Jobs waiting at their key's gate (a limit by the shard key at its
        # cap) are not work for idle threads: left out, so the claim goes on
        # to other keys' jobs (it passes over the full keys', Buffer.full_keys)
        # up to the buffer's capacity.
        buffered = buffer.buffered - buffer.held_back
        wanted = min(target - buffered - buffer.processing, buffer.free - OUTRANKING_ROOM)
        if self.config.options.max_tasks is not None:
            wanted = min(wanted, self.tasks_left())
        return wanted, max(1, target // 4)

    def lookahead_jobs(self) -> int:
        """Jobs buffered beyond the running ones the demand aims at: enough
        for LOOKAHEAD_SECONDS of the threads' work at the measured task time
        (at least one a thread, at most the prefetch). With fair keys
        buffered, at least FAIR_LOOKAHEAD a thread: the local queue can only
        share out what it holds, and each key's share must outlast a claim
        (docs/fairness.md)."""
        concurrency = self.config.concurrency
        average = max(self.average_task_seconds, 1e-6)
        lookahead = max(concurrency, int(concurrency * LOOKAHEAD_SECONDS / average))
        if self.buffer.has_fair:
            lookahead = max(lookahead, FAIR_LOOKAHEAD * concurrency)
        return min(self.config.max_prefetch, lookahead)

    def fair_share(self) -> int:
        """The buffered jobs the fair keys share here (docs/fairness.md):
        the look-ahead, less the smallest batch worth a claim, so with every
        key at its share there is still room to claim a new key's job at
        once; each key's share of it goes by its weight
        (Buffer.full_fair_keys)."""
        lookahead = self.lookahead_jobs()
        return max(1, lookahead - (self.config.concurrency + lookahead) // 4)

    def idle_threads(self) -> int:
        """Threads with nothing to run and nothing waiting for them: a
        limited claim takes slots beyond these only within its fair share
        (shardq/worker/limits.py)."""
        return self.config.concurrency - self.buffer.buffered - self.buffer.processing

    def outranking_claim(self, priority: int) -> OutrankingClaim | None:
        """The claim to make outside demand when a NOTIFY tells of a job of
        ``priority`` in a held shard, or None.

        Only when that outranks a job waiting in memory here (buffered) or
        on its way (an ordinary claim in flight: its jobs are taken as no
        better than the last claim's): otherwise the ordinary claim, which
        takes the highest priority due first, is as good. It takes jobs
        above the lowest one waiting, so every job it claims outranks one
        already here, at most OUTRANKING_BATCH (it goes again while they
        come full), in the room the buffer keeps for them; the local queue
        hands them to the next free thread, ahead of the lower ones.
        """
        waiting = [p for p in (self.buffer.lowest_priority(), self.in_flight_lowest) if p is not None]
        if not waiting or priority <= min(waiting):
            return None
        limit = min(OUTRANKING_BATCH, self.buffer.free)
        if self.config.options.max_tasks is not None:
            limit = min(limit, self.tasks_left())
        if limit <= 0:
            return None
        return OutrankingClaim(min(waiting) + 1, limit)

    def running_in_shard(self, shard: int) -> int:
        """Jobs of ``shard`` still processing here or with an unwritten write."""
        return (
            self.buffer.processing_in_shard(shard)
            + sum(sink.pending_in_shard(shard) for sink in self._sinks)
            + self.handback.pending_in_shard(shard)
        )

    def holds(self, job_id: int) -> bool:
        """Is this job in memory here: buffered, running, or its outcome unwritten?"""
        return self.buffer.holds(job_id) or any(sink.holds(job_id) for sink in self._sinks)

    def finished_jobs(self) -> int:
        """Attempts finished here whose outcome was written (--max-tasks counts these)."""
        stats = self.stats
        return stats["succeeded"] + stats["failed"] + stats["retried"]

    def tasks_left(self) -> int:
        """--max-tasks: jobs still to claim. Jobs in flight (buffered,
        processing, or with an outcome not yet written) will finish here
        too: only what is left after them. Read in the order a job moves
        through them, each counted in the next before it leaves the last, so
        none is missed between reads."""
        max_tasks = self.config.options.max_tasks
        assert max_tasks is not None
        in_flight = self.buffer.buffered
        in_flight += self.buffer.processing
        in_flight += sum(sink.pending for sink in self._sinks)
        return max_tasks - in_flight - self.finished_jobs()
