"""One worker process: leaser + fetcher + local queue + executors + completer.

Shutdown (first SIGTERM, SIGINT or SIGHUP; the rule is in shutdown.py): stop
claiming, put unstarted buffered jobs back to READY, let running jobs finish
within ``grace`` seconds, write every outcome, release the leases (others
take over at once, no TTL wait; each shard as soon as none of its jobs runs
here), mark the worker stopped, exit 0. If the
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
from functools import cached_property
from typing import TYPE_CHECKING

import psycopg

from ..cron import schedules
from ..db.store import LEASE_CHANNEL, DatabaseGuard, WorkerStore, record_listener
from ..tasks import discover
from . import shutdown as shutdown_signals
from .archiver import Archiver
from .completer import Completer
from .executor import Executor
from .fetcher import Fetcher
from .gauges import Gauges
from .handback import HandBack
from .leaser import Leaser
from .listener import Listener, Subscription
from .logs import BootClock
from .pipeline import Pipeline, PipelineConfig, WorkerOptions
from .resolver import Resolver
from .runcontrol import EXIT_RECYCLE
from .scheduler import Scheduler
from .shutdown import signal_name
from .stats import Stats
from .waker import Waker

__all__ = ["Worker", "WorkerOptions"]

if TYPE_CHECKING:
    from .metrics import Metrics

# shardq.cancel() announces a cancelled RUNNING job here (cancel_jobs in shardq/db/sql).
CANCEL_CHANNEL = "shardq_cancel"

logger = logging.getLogger("shardq.worker")

STORES = ("leaser", "fetcher", "completer", "starter", "outrank", "handback", "control", "resolver", "waker")


def worker_stores(database: str, guard: DatabaseGuard) -> dict[str, WorkerStore]:
    """A connection (store) each for the worker's services (STORES), with the
    session settings of what each runs."""
    return {
        name: WorkerStore(
            database,
            f"shardq-{name}",
            guard,
            synchronous_commit=name not in ("fetcher", "starter", "outrank"),
            # The start writes and the acks: id-driven writes, planned once
            # (a plan at each call cost the server more than the write).
            generic_plans=name in ("starter", "completer"),
            # The claims: each shard's walk in the ready index's order on the
            # generic plan too, never a bitmap scan and sort of its slice.
            ordered_walks=name in ("fetcher", "outrank"),
        )
        for name in STORES
    }


class Worker:
    """One worker process's services, wired once (see pipeline.py)."""

    def __init__(self, options: WorkerOptions | None = None, *, metrics: "Metrics | None" = None) -> None:
        self.options = options = options or WorkerOptions()
        self.id = str(uuid.uuid4())
        self.config = PipelineConfig.build(options, self.id)
        settings = self.config.settings
        self.stats = Stats()
        self._stop = threading.Event()
        self.grace_expired = False
        # Set when run control asks for a fresh process (zombie threads).
        self.recycling = False
        # One circuit breaker for the process: when PostgreSQL is down every
        # service sees "database unavailable" and one probe goes out per
        # backoff. A connection each: outrank is the listener's claims of
        # jobs that outrank the buffer, handback the jobs that will not run
        # here, control run control's cancel checks (the last three connect
        # on first use). A claim or start lost in a server crash leaves its
        # jobs READY or CLAIMED (at-least-once); an ack, committed
        # synchronously after it in the WAL, makes it durable too.
        self.database_guard = DatabaseGuard()
        self.store = worker_stores(options.database, self.database_guard)
        self.pipeline = Pipeline(self.config, self.stats, HandBack(self.store["handback"], self.stats), metrics)
        self.buffer, self.handback = self.pipeline.buffer, self.pipeline.handback
        self.completer = Completer(self.config, self.pipeline, self.store["completer"])
        self.pipeline.add_sink(self.completer)
        self.leaser = Leaser(self.config, self.pipeline, self.store["leaser"])
        self.fetcher = Fetcher(self.config, self.pipeline, self.leaser, self.store["fetcher"], self.store["outrank"])
        self.executor = Executor(
            self.config, self.pipeline, self.leaser, self.completer, self.store["starter"], self.store["control"]
        )
        # Moves workflow children on once their parents finished (shardq/workflows.py).
        self.resolver = Resolver(
            self.store["resolver"],
            lambda: sorted(self.leaser.held),
            self.stats,
            channel=settings.channel,
            notify=settings.notify,
        )
        self.pipeline.on_outcomes_written(self.resolver.wake)
        self.listener = self._listener() if settings.notify else None
        self.scheduler: Scheduler | None = None  # built in run(), once the task modules are imported
        self.gauges = (
            Gauges(
                WorkerStore(options.database, "shardq-metrics", self.database_guard),
                metrics,
                sample=self.gauge_sample,
                cluster_seconds=settings.heartbeat_seconds,
                lease_ttl_seconds=settings.lease_ttl_seconds,
                shard_count=settings.shard_count,
            )
            if metrics is not None
            else None
        )

    @cached_property
    def waker(self) -> Waker:
        """Suspended durable jobs back to READY at their time (shardq/durable.py),
        looked at again whenever an executor here suspends one."""
        waker = Waker(self.store["waker"], lambda: sorted(self.leaser.held), self.stats, self.pipeline.wake_fetch)
        self.pipeline.on_suspended(waker.wake)
        return waker

    @cached_property
    def archiver(self) -> Archiver | None:
        """Moves finished jobs to shardq_job_history, on the one worker that
        holds its lock (shardq/worker/archiver.py); none with HISTORY off."""
        history = self.config.settings.history
        if history is None:
            return None
        store = WorkerStore(self.options.database, "shardq-archiver", self.database_guard)
        return Archiver(store, history, self.stats)

    def _listener(self) -> Listener:
        """One LISTEN connection, each channel to its subscriber."""
        subscriptions = {
            **self.fetcher.subscriptions(),
            LEASE_CHANNEL: self.leaser.subscription(),
            CANCEL_CHANNEL: Subscription(self.executor.control.notified),
        }
        return Listener(
            self.options.database,
            self.stats,
            subscriptions,
            on_connected=self.pipeline.wake_fetch,
            on_session=self._record_listener_session,
        )

    def _record_listener_session(self, conn: "psycopg.Connection") -> None:
        """Dead-owner detection: record the LISTEN session beside the lease
        session (``record_listener`` in worker.sql). Both gone at once is a
        dead process: its peers take its shards at their next check, not two
        checks later. A connection error reconnects the listener; the server
        refusing the statement only costs that speed-up (logged)."""
        try:
            record_listener(conn, self.id, self.leaser.detect_dead_owners)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise
        except psycopg.Error as exc:
            logger.warning("could not record the LISTEN session for dead-owner detection: %s", exc)

    # -- what the options say ------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self.options.concurrency

    @property
    def grace(self) -> float:
        return self.options.grace

    @property
    def max_tasks(self) -> int | None:
        return self.options.max_tasks

    @property
    def name(self) -> str | None:
        return self.options.name

    @property
    def pool(self) -> str:
        return self.config.pool

    def gauge_sample(self) -> tuple[int, int, int]:
        """(shards leased, jobs on a thread, threads) for the metrics' gauges."""
        return len(self.leaser.held), self.buffer.processing, self.concurrency

    def finished_jobs(self) -> int:
        """Attempts finished here whose outcome was written (--max-tasks counts these)."""
        return self.pipeline.finished_jobs()

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
            self.config.settings.lease_ttl_seconds,
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
                f"after {self.config.settings.max_worker_losses} lost workers)"
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
        boot = BootClock()
        discover(tuple(self.config.task_modules))
        boot.mark("tasks imported")
        self.store["leaser"].register_worker(
            self.id,
            socket.gethostname(),
            os.getpid(),
            self.options.queues or [],
            name=self.name,
            pool=self.pool,
            shard_count=self.config.settings.shard_count,
            identity=self.leaser.detect_dead_owners,
        )
        logger.info(
            "worker %s started (pid %s, concurrency %s, queues %s, pool %s, %s shards, lease TTL %gs)",
            self.label,
            os.getpid(),
            self.concurrency,
            self.options.queues
            or (f"all but {', '.join(self.options.exclude_queues)}" if self.options.exclude_queues else "all"),
            self.pool,
            self.config.settings.shard_count,
            self.config.settings.lease_ttl_seconds,
        )
        boot.mark("registered")
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
            self.listener.listening.wait(timeout=min(5.0, self.config.settings.heartbeat_seconds))
            boot.mark("listening")
        # Running workers recompute their share now, not at their next heartbeat.
        self.leaser.announce()
        self.fetcher.start()
        logger.info("worker %s boot: %s; claiming", self.label, boot.summary())
        self.resolver.start()
        self.waker.start()
        if schedules():
            self.scheduler = Scheduler(schedules(), self.stats)
            self.scheduler.start()
        if self.gauges:
            self.gauges.start()
        if self.archiver:
            self.archiver.start()
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
            self.waker,
            self.listener,
            self.gauges,
            self.archiver,
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
        limiter = self.pipeline.limiter
        if limiter is None or not (limiter.holding() or limiter.take_released()):
            return
        try:
            self.store["fetcher"].renew_limit_slots(
                self.id, limiter.to_renew(self.pipeline.holds), self.config.settings.lease_ttl_seconds
            )
        except Exception as exc:  # the database may be gone: the slots expire
            logger.warning("could not free limit slots at shutdown (%s); they will expire", exc)

    def shutdown(self) -> None:
        deadline = time.monotonic() + self.grace
        if self.scheduler:
            self.scheduler.stop(time.monotonic() + 10.0)
        self.resolver.stop(time.monotonic() + 10.0)
        self.waker.stop(time.monotonic() + 10.0)
        if self.archiver:
            self.archiver.stop(time.monotonic() + 10.0)
        self.leaser.begin_stop()
        self.fetcher.stop(time.monotonic() + 10.0)
        if self.listener:
            self.listener.stop(time.monotonic() + 5.0)
        self.handback.return_jobs(self.buffer.drain())
        # Nothing is buffered or being claimed now: each shard goes to the
        # next owner as soon as none of its jobs runs here, not at the end.
        self.leaser.release_when_idle()
        if self.pipeline.limiter is not None:
            self.pipeline.limiter.stop_waiting()
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
        still_running = {
            s for s in list(self.leaser.held) if self.pipeline.running_in_shard(s) > control.zombies_in_shard(s)
        }
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
            released = self.leaser.release_all(keep=still_running) + self.leaser.released_while_stopping
            self.store["leaser"].stop_worker(self.id, self.stats.snapshot())
            logger.info("worker %s stopped: released %s shards; %s", self.label, released, self.stats.snapshot())
        except Exception as exc:  # the database may be gone: leases then expire
            logger.warning("could not release leases at shutdown (%s); they will expire", exc)
        for store in self.store.values():
            store.close()
