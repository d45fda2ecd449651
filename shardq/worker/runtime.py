"""One worker process: leaser + fetcher + local queue + executors + completer.

Shutdown (first SIGTERM, SIGINT or SIGHUP; the rule is in shutdown.py): stop
claiming, put unstarted buffered jobs back to READY, let running jobs finish
within ``grace`` seconds, write every outcome, release the leases (others
take over at once, no TTL wait), mark the worker stopped, exit 0. If the
grace runs out first, the jobs still running are named in a WARNING (each
attempt ends as a worker loss when its shard's lease expires and is taken
over) and the process exits 1. A second signal (not the same one repeated
within a second) or SIGQUIT exits at once, 1, naming the running jobs the
same way.
"""

import logging
import os
import socket
import threading
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING

from ..conf import get_config
from ..core import pools
from ..cron import schedules
from ..db.store import DatabaseGuard, WorkerStore
from ..limits import KeyCaps, queue_limits
from ..tasks import autodiscover, resolve
from . import shutdown as shutdown_signals
from .buffer import Buffer
from .completer import Completer
from .executor import Executor
from .fetcher import Fetcher, Listener, OutrankingClaim
from .gauges import Gauges
from .handback import HandBack
from .leaser import Leaser
from .limits import Limiter
from .resolver import Resolver
from .runcontrol import EXIT_RECYCLE
from .scheduler import Scheduler
from .shutdown import signal_name
from .stats import Stats

if TYPE_CHECKING:
    from ..metrics import Metrics

logger = logging.getLogger("shardq.worker")

LOOKAHEAD_SECONDS = 0.05
# A claim outside demand (Worker.outranking_claim) takes at most this many
# jobs; the buffer keeps OUTRANKING_ROOM places that only such claims fill.
OUTRANKING_BATCH = 16
OUTRANKING_ROOM = 64


class Worker:
    def __init__(
        self,
        *,
        queues: list[str] | None = None,
        concurrency: int = 4,
        grace: float = 30.0,
        prefetch: int | None = None,
        database: str = "default",
        exclude_queues: list[str] | None = None,
        backend: str | None = pools.DEFAULT_BACKEND,
        max_tasks: int | None = None,
        name: str | None = None,
        metrics: "Metrics | None" = None,
    ):
        self.config = get_config()
        self.metrics = metrics  # None: metrics off (the services test this, nothing else)
        self.id = str(uuid.uuid4())
        self.name = name  # --worker-id: shown next to the id in logs and shardq_status
        self.queues = queues
        self.exclude_queues = exclude_queues
        # Shards are leased per pool, the queue selection (DESIGN §4.8).
        self.pool = pools.pool_name(queues, exclude_queues, backend)
        # --max-tasks: stop gracefully once this many jobs finished here, and
        # never claim more than are left (see demand()).
        self.max_tasks = max_tasks
        self.concurrency = concurrency
        self.grace = grace
        self.database = database
        self.stats = Stats()
        self._stop = threading.Event()
        self.grace_expired = False
        # The look-ahead (jobs claimed beyond the running ones) is at most
        # ``prefetch``; how much of it is used follows the measured task time.
        self.max_prefetch = prefetch if prefetch else 512
        self.buffer = Buffer(
            concurrency + self.max_prefetch + OUTRANKING_ROOM,
            key_cap=KeyCaps(partial(resolve, extra_modules=self.config.task_modules)),
        )
        # One circuit breaker for the process: when PostgreSQL is down every
        # service sees "database unavailable" and one probe goes out per backoff.
        self.database_guard = DatabaseGuard()
        self.store = {
            name: WorkerStore(
                database,
                f"shardq-{name}",
                self.database_guard,
                # A claim lost in a server crash leaves its
                # jobs READY (run again: at-least-once); an
                # ack, committed synchronously after it in
                # the WAL, makes the claim durable too.
                synchronous_commit=name not in ("fetcher", "starter", "outrank"),
            )
            # outrank: the listener's claims of jobs that outrank this
            # worker's buffer (Fetcher.outrank); connects on first use.
            # handback: claimed jobs that will not run here go back to READY.
            # control: run control's cancel checks (runcontrol.py), on first use.
            for name in ("leaser", "fetcher", "completer", "starter", "outrank", "handback", "control", "resolver")
        }
        self.handback = HandBack(self.store["handback"], self.stats)
        self.completer = Completer(
            self.store["completer"],
            self.stats,
            batch=self.config.completion_batch,
            flush_seconds=self.config.completion_flush_seconds,
            metrics=metrics,
        )
        self.leaser = Leaser(
            self.store["leaser"],
            self.id,
            self.stats,
            shard_count=self.config.shard_count,
            lease_ttl_seconds=self.config.lease_ttl_seconds,
            heartbeat_seconds=self.config.heartbeat_seconds,
            running_in_shard=self.running_in_shard,
            on_lost=self.on_shards_lost,
            on_gained=self.on_shards_gained,
            expected_workers=int(os.environ.get("SHARDQ_EXPECTED_WORKERS", "1")),
            max_worker_losses=self.config.max_worker_losses,
            pool=self.pool,
        )
        self.fetcher = Fetcher(
            self.store["fetcher"],
            self.leaser,
            self.buffer,
            self.completer,
            self.stats,
            worker_id=self.id,
            queues=queues,
            exclude_queues=exclude_queues,
            backend=backend,
            poll_interval_seconds=self.config.poll_interval_seconds,
            demand=self.demand,
            outranking_claim=self.outranking_claim,
            outranking_store=self.store["outrank"],
            holds=self.holds_job,
            metrics=metrics,
            handback=self.handback,
            limiter=Limiter(
                worker_id=self.id,
                queue_limits=queue_limits(),
                task_modules=self.config.task_modules,
                lease_ttl_seconds=self.config.lease_ttl_seconds,
                heartbeat_seconds=self.config.heartbeat_seconds,
                poll_interval_seconds=self.config.poll_interval_seconds,
                concurrency=concurrency,
                task_seconds=lambda: self.executor.measured_task_seconds(),
            ),
            idle_threads=self.idle_threads,
            lease_ttl_seconds=self.config.lease_ttl_seconds,
            limit_channel=self.config.channel + "_limit",
        )
        self.listener = (
            Listener(
                self.config.channel,
                self.leaser,
                self.fetcher,
                self.stats,
                database,
                shard_count=self.config.shard_count,
                on_cancel=self.on_cancel_notified,
            )
            if self.config.notify
            else None
        )
        # Moves workflow children on once their parents finished (shardq/workflows.py).
        self.resolver = Resolver(
            self.store["resolver"],
            lambda: sorted(self.leaser.held),
            self.stats,
            channel=self.config.channel,
            notify=self.config.notify,
        )
        self.completer.on_written = self.resolver.wake
        self.scheduler: Scheduler | None = None  # built in run(), once the task modules are imported
        self.executor = Executor(
            self.buffer,
            self.completer,
            self.leaser,
            self.fetcher,
            self.stats,
            worker_id=self.id,
            concurrency=concurrency,
            start_store=self.store["starter"],
            handback=self.handback,
            task_modules=self.config.task_modules,
            metrics=metrics,
            control_store=self.store["control"],
        )
        # Set when run control asks for a fresh process (zombie threads).
        self.recycling = False
        self.gauges = (
            Gauges(
                WorkerStore(database, "shardq-metrics", self.database_guard),
                metrics,
                sample=self.gauge_sample,
                cluster_seconds=self.config.heartbeat_seconds,
                lease_ttl_seconds=self.config.lease_ttl_seconds,
                shard_count=self.config.shard_count,
            )
            if metrics is not None
            else None
        )

    # -- callbacks ---------------------------------------------------------------

    def running_in_shard(self, shard: int) -> int:
        """Jobs of ``shard`` still processing here or with an unwritten outcome."""
        return (
            self.buffer.processing_in_shard(shard)
            + self.completer.pending_in_shard(shard)
            + self.handback.pending_in_shard(shard)
        )

    def demand(self) -> tuple[int, int]:
        """(jobs to claim now, smallest batch worth a round trip).

        In flight = running + buffered, aimed at the concurrency plus enough
        buffered jobs to cover LOOKAHEAD_SECONDS of work at the measured task
        duration: a no-op task gets hundreds (a claim round trip is amortised),
        a one-second task gets one per thread (nothing waits in memory while
        another worker could run it).
        """
        average = max(self.executor.average_task_seconds, 1e-6)
        lookahead = int(self.concurrency * LOOKAHEAD_SECONDS / average)
        target = self.concurrency + min(self.max_prefetch, max(self.concurrency, lookahead))
        running = self.buffer.processing
        # Jobs waiting at their key's gate (a limit by the shard key at its
        # cap) are not work for idle threads: left out, so the claim goes on
        # to other keys' jobs (it passes over the full keys', Buffer.full_keys)
        # up to the buffer's capacity.
        buffered = self.buffer.buffered - self.buffer.held_back
        wanted = min(target - buffered - running, self.buffer.free - OUTRANKING_ROOM)
        if self.max_tasks is not None:
            wanted = min(wanted, self.tasks_left())
        return wanted, max(1, target // 4)

    def idle_threads(self) -> int:
        """Threads with nothing to run and nothing waiting for them: a
        limited claim takes slots beyond these only within its fair share
        (shardq/worker/limits.py)."""
        return self.concurrency - self.buffer.buffered - self.buffer.processing

    def gauge_sample(self) -> tuple[int, int, int]:
        """(shards leased, jobs on a thread, threads) for the metrics' gauges."""
        return len(self.leaser.held), self.buffer.processing, self.concurrency

    def tasks_left(self) -> int:
        """--max-tasks: jobs still to claim. Jobs in flight (buffered,
        processing, or with an outcome not yet written) will finish here
        too: only what is left after them. Read in the order a job moves
        through them, each counted in the next before it leaves the last, so
        none is missed between reads."""
        assert self.max_tasks is not None
        in_flight = self.buffer.buffered
        in_flight += self.buffer.processing
        in_flight += self.completer.pending
        return self.max_tasks - in_flight - self.finished_jobs()

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
        waiting = [p for p in (self.buffer.lowest_priority(), self.fetcher.in_flight_lowest) if p is not None]
        if not waiting or priority <= min(waiting):
            return None
        limit = min(OUTRANKING_BATCH, self.buffer.free)
        if self.max_tasks is not None:
            limit = min(limit, self.tasks_left())
        if limit <= 0:
            return None
        return OutrankingClaim(min(waiting) + 1, limit)

    def finished_jobs(self) -> int:
        """Attempts finished here whose outcome was written (--max-tasks counts these)."""
        return self.stats["succeeded"] + self.stats["failed"] + self.stats["retried"]

    def holds_job(self, job_id: int) -> bool:
        """Is this job in memory here: buffered, running, or its outcome unwritten?"""
        return self.buffer.holds(job_id) or self.completer.holds(job_id)

    def on_cancel_notified(self, payload: str) -> None:
        self.executor.control.notified(payload)

    def on_shards_gained(self, shards: set[int]) -> None:
        """New shards: claim from them now rather than at the next poll."""
        self.fetcher.wake()

    def on_shards_lost(self, shards: set[int]) -> None:
        """Self-fence or drain: forget the buffered jobs of these shards."""
        dropped = []
        for shard in shards:
            dropped.extend(self.buffer.drop_shard(shard))
        self.handback.return_jobs(dropped)

    # -- lifecycle ---------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT/SIGHUP: graceful stop; again later, or SIGQUIT: now."""
        shutdown_signals.install().bind(self._on_stop_signal, self._exit_now)

    def _on_stop_signal(self, signum: int) -> None:
        logger.info("%s: finishing running jobs (grace %.0fs), then releasing leases", signal_name(signum), self.grace)
        self._stop.set()

    def abandoned_jobs(self) -> tuple[list[int], list[int]]:
        """Jobs not finished here: (started: RUNNING in the table under this
        worker's claim; being started: a start write may be in flight)."""
        jobs = self.buffer.processing_jobs()
        return (sorted(job.id for job in jobs if job.is_started), sorted(job.id for job in jobs if not job.is_started))

    def _exit_now(self, signum: int) -> None:
        logger.warning(
            "%s: exiting now without waiting for running jobs; %s; leases expire after %gs and are taken over",
            signal_name(signum),
            self._abandoned(*self.abandoned_jobs()),
            self.config.lease_ttl_seconds,
        )
        for handler in filter(None, [*logging.getLogger().handlers, logging.lastResort]):
            try:
                handler.flush()
            except Exception:
                pass
        os._exit(1)

    def _abandoned(self, started: list[int], starting: list[int] | tuple[int, ...] = ()) -> str:
        """What exiting now costs, by job id (an operator greps for them)."""
        text = "no job is running"
        if started:
            text = (
                f"job(s) {', '.join(map(str, started))} will end as WorkerLost (the attempt is "
                f"interrupted: run again by the shard's next owner, or dead-lettered as WorkerLost "
                f"after {self.config.max_worker_losses} lost workers)"
            )
        if starting:
            text += (
                f"; job(s) {', '.join(map(str, starting))} were being started (WorkerLost too if "
                "the start write landed, else back to READY for free)"
            )
        return text

    @property
    def label(self) -> str:
        """The id, with the --worker-id name when one was given: ``name (uuid)``."""
        return f"{self.name} ({self.id})" if self.name else self.id

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        autodiscover(self.config.task_modules)
        self.store["leaser"].register_worker(
            self.id,
            socket.gethostname(),
            os.getpid(),
            self.queues or [],
            name=self.name,
            pool=self.pool,
            shard_count=self.config.shard_count,
        )
        logger.info(
            "worker %s started (pid %s, concurrency %s, queues %s, pool %s, %s shards, lease TTL %gs)",
            self.label,
            os.getpid(),
            self.concurrency,
            self.queues or (f"all but {', '.join(self.exclude_queues)}" if self.exclude_queues else "all"),
            self.pool,
            self.config.shard_count,
            self.config.lease_ttl_seconds,
        )
        self.completer.start()
        self.handback.start()
        self.executor.start()
        self.leaser.start()
        if self.listener:
            self.listener.start()
            # Listen before announcing: the running workers answer the
            # announcement by releasing shards within milliseconds, and the
            # release's NOTIFY is what makes this worker claim them at once
            # (announced first, a joiner at the default 10 s heartbeat often
            # missed it and held nothing until its next heartbeat).
            self.listener.listening.wait(timeout=min(5.0, self.config.heartbeat_seconds))
        # Running workers recompute their share now, not at their next heartbeat.
        self.leaser.announce()
        self.fetcher.start()
        self.resolver.start()
        if schedules():
            self.scheduler = Scheduler(schedules(), self.stats)
            self.scheduler.start()
        if self.gauges:
            self.gauges.start()
        failed = None
        while not self._stop.wait(0.5 if self.max_tasks is None else 0.05):
            failed = self._failed_service()
            if failed:
                logger.error("%s stopped unexpectedly: shutting down", failed)
                break
            recycle = self.executor.control.recycle_reason
            if recycle is not None:
                # Nothing is lost: buffered jobs go back, the other running
                # jobs finish, the zombies' outcomes are written already.
                logger.error(
                    "worker %s: %s; stopping to be replaced by a fresh process (exit %s)",
                    self.label,
                    recycle,
                    EXIT_RECYCLE,
                )
                self.recycling = True
                break
            if self.max_tasks is not None and self.finished_jobs() >= self.max_tasks:
                logger.info(
                    "worker %s finished %s jobs (--max-tasks %s): stopping",
                    self.label,
                    self.finished_jobs(),
                    self.max_tasks,
                )
                break
        self.shutdown()
        if failed or self.grace_expired:
            return 1
        return EXIT_RECYCLE if self.recycling else 0

    def services(self) -> list:
        """Every service thread of this worker, the listener included: each
        has a ``name``, ``start``, ``stop(deadline)`` and ``failure``."""
        found = [
            self.leaser,
            self.fetcher,
            self.completer,
            self.handback,
            self.executor,
            self.executor.control,
            self.scheduler,
            self.resolver,
            self.listener,
            self.gauges,
        ]
        return [service for service in found if service is not None]

    def _failed_service(self) -> str | None:
        for service in self.services():
            if service.failure is not None:
                return service.name
        return None

    def _release_limit_slots(self) -> None:
        """At shutdown: free every limit slot this worker holds, except those
        of jobs whose threads still run (past the grace): those expire with
        their lease, as a dead worker's do."""
        limiter = self.fetcher.limiter
        if limiter is None or not (limiter.holding() or limiter.take_released()):
            return
        try:
            self.store["fetcher"].renew_limit_slots(
                self.id, limiter.to_renew(self.holds_job), self.config.lease_ttl_seconds
            )
        except Exception as exc:  # the database may be gone: the slots expire
            logger.warning("could not free limit slots at shutdown (%s); they will expire", exc)

    def shutdown(self) -> None:
        deadline = time.monotonic() + self.grace
        if self.scheduler:
            self.scheduler.stop(time.monotonic() + 10.0)
        self.resolver.stop(time.monotonic() + 10.0)
        self.leaser.begin_stop()
        self.fetcher.stop(time.monotonic() + 10.0)
        if self.listener:
            self.listener.stop(time.monotonic() + 5.0)
        self.handback.return_jobs(self.buffer.drain())
        if self.fetcher.limiter is not None:
            self.fetcher.limiter.stop_waiting()
        finished = self.executor.stop(deadline)
        self.completer.stop(deadline=max(deadline, time.monotonic() + 5.0))
        self.handback.stop(max(deadline, time.monotonic() + 5.0))
        if self.gauges:
            self.gauges.stop(time.monotonic() + 10.0)
        self._release_limit_slots()
        # Shards with a job still running keep their lease until it expires:
        # releasing them would let the next owner re-run a job that may still
        # finish here.
        # A zombie's job is not running for this purpose: its outcome was
        # written at its deadline, and this process exits now.
        control = self.executor.control
        still_running = {s for s in list(self.leaser.held) if self.running_in_shard(s) > control.zombies_in_shard(s)}
        if not finished:
            self.grace_expired = True
            logger.warning(
                "grace period of %gs is over with jobs running (shards %s): %s; exiting 1",
                self.grace,
                sorted(still_running),
                self._abandoned(*self.abandoned_jobs()),
            )
        self.leaser.stop()
        try:
            released = self.leaser.release_all(keep=still_running)
            self.store["leaser"].stop_worker(self.id, self.stats.snapshot())
            logger.info("worker %s stopped: released %s shards; %s", self.label, released, self.stats.snapshot())
        except Exception as exc:  # the database may be gone: leases then expire
            logger.warning("could not release leases at shutdown (%s); they will expire", exc)
        for store in self.store.values():
            store.close()
