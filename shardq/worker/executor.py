"""Executors: ``concurrency`` threads for sync tasks, one asyncio loop for async ones.

Each thread pops the best buffered job, checks that its shard's lease is still
trusted (a job of a lost shard never starts), resolves the task through the
registry (never importing an arbitrary callable named in a row), runs it,
and hands the outcome to the completer. Signals ``task_started`` and
``task_finished`` are sent with a real ``TaskResult``.
"""

import asyncio
import dataclasses
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, NoReturn

from django.db import close_old_connections, connections, transaction
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import log_task_finished, log_task_started, task_finished, task_started
from django.utils import timezone

from .. import tracing
from ..completion import CommittedByTask
from ..conf import timeout_seconds
from ..core.rwlock import RWLock
from ..db import operations
from ..db.store import WorkerStore
from ..dispatch import LogVerdicts, SignalGate
from ..durable import DurableRun
from ..exceptions import (
    DurableNeedsSyncTask,
    DurableStop,
    FenceLost,
    Interrupted,
    LoggedTaskError,
    ResultTooLarge,
    Suspended,
    TaskTimeout,
    UnknownTask,
)
from ..tasks import Backoff, ShardTask, resolve
from ..tasks.redaction import redact_text, sensitive_values
from .completer import Completer
from .joblogs import CAPTURE, CURRENT, AttemptLog, end_attempt, scoped, thread_scope
from .jobs import STARTED, ClaimedJob, Outcome
from .leaser import Leaser
from .pipeline import Pipeline, PipelineConfig
from .runcontrol import Attempt, RunControl
from .service import DEFAULT_STOP_SECONDS
from .starter import LOST, REJECTED, UNAVAILABLE, Gather, StartWrites

if TYPE_CHECKING:
    from .limits import Limiter

logger = logging.getLogger("shardq.worker.executor")

# A start write waits for the threads inside tasks to ask too (starter.py,
# StartWrites._gather) only while the measured task time is at most
# GATHER_TASK_SECONDS, and for at most twice that plus GATHER_SLACK_SECONDS.
GATHER_TASK_SECONDS = 0.001
GATHER_SLACK_SECONDS = 0.0002

# How long a job that lost a worker waits for the jobs running beside it to
# finish before it goes back READY (Executor._isolated).
SOLO_WAIT_SECONDS = 60.0

DEFAULT_BACKOFF = Backoff()


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardqTaskContext(TaskContext):
    """Django's TaskContext plus this attempt's fencing token, shard and the
    status_rank its outcome must carry (for ``shardq.complete_in_transaction``)."""

    fence: int
    shard: int
    rank: int = 0
    # Set by complete_in_transaction once the task's own transaction has
    # committed the outcome: the executor then writes nothing more.
    completion_state: CommittedByTask = field(default_factory=CommittedByTask, repr=False, compare=False)
    # This attempt under run control (its deadline and cancel flag), or None.
    control: Attempt | None = field(default=None, repr=False, compare=False)
    # Its durable calls (shardq/durable.py), or None outside a worker.
    durable: DurableRun | None = field(default=None, repr=False, compare=False)
    # The task is an ``async def``: durable calls are refused, saying why.
    is_async: bool = field(default=False, repr=False, compare=False)

    def _durable(self) -> DurableRun:
        if self.is_async:
            raise DurableNeedsSyncTask(
                f"{self.task_result.task.module_path if self.task_result else 'this task'} is an `async def` "
                "task: durable calls (step, iterate, sleep, sleep_until, wait_for) run in sync tasks only. "
                "Each batch's writes commit with its cursor in one transaction on the task thread's Django "
                "connection, which an async task does not hold (its ORM calls hop to other threads). Declare "
                "the task with `def` (it runs on the worker's threads) and call async code from it with "
                'asgiref.sync.async_to_sync (docs/durable.md, "Sync tasks only").'
            )
        if self.durable is None:
            raise RuntimeError(
                "durable calls (step, iterate, sleep, wait_for) need the context a shardq worker "
                "passes to a sync task declared with takes_context=True"
            )
        return self.durable

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` once for this job and record its JSON
        output under ``name`` (fenced); later runs of the job (a retry, a
        resume, a crash's re-run) return the recorded output without calling
        it. Two steps of one name in one run raise ``DuplicateStep``."""
        return self._durable().step(name, fn, *args, **kwargs)

    def iterate(self, source: Any, by: str = "pk", size: int = 100, **options: Any) -> Any:
        """Batches of ``source`` from where the job left off: a QuerySet
        walked by keyset on ``by`` (each batch's transaction commits the
        cursor with the batch's writes: exactly once), or a function
        ``fn(cursor) -> (items, next_cursor)`` (``next_cursor`` None: the
        end; at least once per batch). See docs/durable.md."""
        return self._durable().iterate(source, by, size, **options)

    def sleep(self, delay: Any) -> None:
        """Suspend the job for ``delay`` (a timedelta or seconds): the
        thread is freed; the job runs again from the top once it is due."""
        self._durable().sleep(delay)

    def sleep_until(self, when: datetime) -> None:
        """Suspend the job until ``when`` (an aware datetime)."""
        self._durable().sleep_until(when)

    def wait_for(self, name: str, timeout: Any = None) -> Any:
        """The payload of signal ``name`` (``shardq.signal``): at once if it
        was sent already, else the job suspends until it arrives; past
        ``timeout`` (a timedelta or seconds; None: none) ``SignalTimeout``."""
        return self._durable().wait_for(name, timeout)

    @property
    def deadline(self) -> datetime | None:
        """When this attempt's time is up (timezone-aware), or None: no timeout."""
        return None if self.control is None else self.control.deadline_at

    def time_left(self) -> float | None:
        """Seconds until the deadline (negative once past), or None: no timeout."""
        return None if self.control is None else self.control.time_left()

    def check_timeout(self) -> None:
        """Raise ``TaskTimeout`` once the deadline has passed (a cheap check
        for loops that would rather stop at a point of their choosing)."""
        if self.control is not None and (self.control.expired or (self.control.time_left() or 0.0) < 0):
            raise TaskTimeout(f"job {self.task_result.id} ran past its timeout of {self.control.timeout_seconds:g}s")

    def is_cancelled(self) -> bool:
        """Was the job cancelled (``shardq.cancel``) while this attempt runs?
        The worker learns it from a NOTIFY at once, or at its next heartbeat;
        this reads a flag, no I/O. The job's outcome is written already: stop
        and return."""
        return self.control is not None and self.control.cancelled

    @property
    def parent_results(self) -> dict[str, TaskResult]:
        """A workflow job's parents: each parent's step name (or, for
        ``using(after=...)``, its task's name) -> its ``TaskResult``, read
        from the table now. Empty for a job with no parents. A parent that
        failed (``on_parent_failure="run"``) shows FAILED with its errors."""
        from django.tasks import task_backends

        from ..db import operations

        backend = task_backends[self.task_result.backend]
        rows = operations.run(
            "parent_results",
            {"id": int(self.task_result.id)},
            using=getattr(backend, "database_alias", "default"),
            named=True,
        )
        return {row["step_name"]: backend.result_from_row(row) for row in rows}


# A traceback longer than this is stored as its head and tail.
MAX_ERROR_CHARS = 64 * 1024


def sanitize_text(text: str) -> str:
    """Error text PostgreSQL's jsonb will store: NUL and lone surrogates
    escaped, at most MAX_ERROR_CHARS (head and tail kept)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2
        text = f"{text[:half]}\n... ({len(text) - MAX_ERROR_CHARS} characters left out) ...\n{text[-half:]}"
    return text


def unstorable_json_text(value: object, path: str = "value") -> str | None:
    """Where ``value`` holds a string jsonb refuses (a NUL, a lone
    surrogate), or None. Only called when the JSON text has a \\u escape."""
    if isinstance(value, str):
        if "\x00" in value:
            return f"{path} contains a NUL character (\\u0000)"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path} contains a lone surrogate (not valid Unicode text)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = unstorable_json_text(key, f"{path} key {key!r}") or unstorable_json_text(item, f"{path}[{key!r}]")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = unstorable_json_text(item, f"{path}[{index}]")
            if found:
                return found
    return None


def _class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


# An exception's message in a log record, at most (head kept): a task's
# exception may carry megabytes (a response body, a whole payload).
LOGGED_MESSAGE_CHARS = 2000


def _exception_line(exc: BaseException, hidden: Sequence[str] = ()) -> str:
    """``ValueError: message`` on one line (a long message cut at 500
    characters), the ``hidden`` values (sensitive arguments') redacted."""
    message = _bounded_message(exc, 500 + 1, hidden)
    message = " ".join(message.split())
    if len(message) > 500:
        message = message[:500] + "…"
    name = type(exc).__qualname__ if type(exc).__module__ == "builtins" else _class_path(exc)
    return f"{name}: {message}" if message else name


def _bounded_message(exc: BaseException, chars: int, hidden: Sequence[str] = ()) -> str:
    """``str(exc)``, cut to ``chars`` characters, sensitive values hidden.
    Cut before redaction with room for the longest value, so a value cut in
    two is still found; a str() that raises is reported, not raised."""
    try:
        text = str(exc)
    except Exception as broken:  # a task's __str__ is the task's code
        return f"<str() of the exception raised {type(broken).__name__}>"
    room = max((len(v) for v in hidden), default=0)
    cut = len(text) > chars
    text = redact_text(text[: chars + room], hidden)[:chars] if hidden else text[:chars]
    return text + "…" if cut else text


def _logged_stand_in(error: BaseException, hidden: Sequence[str]) -> LoggedTaskError | None:
    """A LoggedTaskError for the task_finished log record when ``error``'s
    text (or that of an exception chained to it) is too long or holds a
    sensitive value; None when it may be logged as it is."""
    seen: set[int] = set()
    current: BaseException | None = error
    safe = True
    while current is not None and id(current) not in seen and safe:
        seen.add(id(current))
        try:
            text = str(current)
        except Exception:
            text = ""
        if len(text) > LOGGED_MESSAGE_CHARS or any(value in text for value in hidden):
            safe = False
        current = current.__cause__ or current.__context__
    if safe:
        return None
    stand_in = LoggedTaskError(
        f"{_class_path(error)}: {_bounded_message(error, LOGGED_MESSAGE_CHARS, hidden)} "
        "(shown bounded, sensitive argument values hidden; chained exceptions left out)"
    )
    return stand_in.with_traceback(error.__traceback__)


class Executor:
    """The pool of threads that run jobs (``concurrency`` of them, plus the
    async loop's), with a Service's interface: ``name``, ``start``,
    ``stop(deadline)`` and ``failure``."""

    name = "executor"

    def __init__(
        self,
        config: PipelineConfig,
        pipeline: Pipeline,
        leaser: Leaser,
        completer: Completer,
        start_store: WorkerStore,
        control_store: WorkerStore | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.metrics = pipeline.metrics
        self.completer = completer
        self.handback = pipeline.handback
        self.leaser = leaser
        self.stats = pipeline.stats
        self.worker_id = config.worker_id
        self.concurrency = config.concurrency
        self.lease_ttl_seconds = config.lease_ttl_seconds
        self._backend_classes: dict[str, type[BaseTaskBackend]] = {}
        self.task_modules = config.task_modules
        # A job that lost a worker runs alone in this process (_isolated).
        self._solo = RWLock()
        settings = config.settings
        self.max_payload_bytes = settings.max_payload_bytes
        self.max_result_bytes = settings.max_result_bytes
        self.default_timeout_seconds = settings.task_timeout_seconds
        self.unknown_task_timeout_seconds = settings.unknown_task_timeout_seconds
        # Per-job logs (joblogs.py): each attempt's records kept, bounded (0: off).
        self.job_log_bytes = settings.job_log_bytes
        self.job_log_level = settings.job_log_level
        self._capturing = False
        # Timeouts, cancels seen by running tasks, zombie threads (runcontrol.py).
        self.control = RunControl(
            control_store or WorkerStore(config.database, application_name="shardq-runcontrol"),
            self.stats,
            on_deadline=self._timed_out,
            poll_seconds=settings.heartbeat_seconds,
            max_zombies=settings.max_zombies,
            zombie_grace_seconds=settings.zombie_grace_seconds,
            concurrency=config.concurrency,
        )
        self._stop = threading.Event()
        self._local = threading.local()
        # One verdict on the django.tasks logger for both signals.
        self.task_log = LogVerdicts(logging.getLogger("django.tasks"))
        self.started_gate = SignalGate(task_started, log_task_started, self.task_log)
        self.finished_gate = SignalGate(task_finished, log_task_finished, self.task_log)
        self._threads: list[threading.Thread] = []
        # The async tasks' event loop: made by start(), closed by stop() (an
        # executor built and never started holds no loop, sockets or thread).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        # Records each job's start as its thread begins it (starter.py).
        # The completer's queued outcomes ride on these writes (completer.py).
        self.starts = StartWrites(
            start_store,
            self.stats,
            config.worker_id,
            pipeline.signals.started,
            completer,
            Gather(self._gather_seconds, self._others_awake),
        )

    def _others_awake(self) -> int:
        return self.concurrency - 1 - self.pipeline.buffer.waiting

    def _gather_seconds(self) -> float:
        """How long a start write waits for the threads inside tasks to ask
        too: only for short tasks (measured), with work buffered for them."""
        pipeline = self.pipeline
        average = pipeline.average_task_seconds
        if not pipeline.task_measured or average > GATHER_TASK_SECONDS:
            return 0.0
        if pipeline.buffer.buffered <= 0:
            return 0.0
        return 2 * average + GATHER_SLACK_SECONDS

    def start(self) -> None:
        if self.job_log_bytes:
            CAPTURE.install(self.job_log_level)
            self._capturing = True
        self.control.start()
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="shardq-async", daemon=True)
        self._loop_thread.start()
        for n in range(self.concurrency):
            thread = threading.Thread(target=self._run, name=f"shardq-executor-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, deadline: float | None = None) -> bool:
        """Stop starting jobs; wait until ``deadline`` (monotonic; None: 10 s)
        for the started ones. True if all finished. Zombie threads (stuck past
        their task's timeout, its outcome written) are not waited for: they
        may never return."""
        if deadline is None:
            deadline = time.monotonic() + DEFAULT_STOP_SECONDS
        self._stop.set()
        self.pipeline.buffer.wake_all()
        while True:
            zombies = self.control.zombie_threads()
            waiting = [t for t in self._threads if t.is_alive() and t.ident not in zombies]
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                break
            waiting[0].join(timeout=min(left, 0.25))
        finished = not waiting
        self.control.stop()
        if self._capturing:
            self._capturing = False
            CAPTURE.uninstall()
        if finished and self.loop is not None and self._loop_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=5)
            if not self._loop_thread.is_alive():
                self.loop.close()
        return finished

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Stopping: the jobs still buffered go back (Worker.shutdown),
                # none is begun.
                job = self.pipeline.buffer.pop(timeout=0.25)
                if job is None:
                    continue
                # A limited job's limiter (None: the job counts against no limit).
                limiter = self.pipeline.limiter
                if limiter is not None and not limiter.tracks(job.id):
                    limiter = None
                outcome = None
                try:
                    # The slot first, then the start: a job waiting for its
                    # limit is CLAIMED, not RUNNING (docs/limits.md).
                    if limiter is not None and not limiter.acquire(job.id, self.lease_ttl_seconds):
                        # No slot of its limit came back here within a lease
                        # (docs/limits.md): hand it back unrun, for any worker.
                        self.handback.return_jobs([job])
                        continue
                    outcome = self.run_job(job)
                    if outcome is not None:  # None: nothing to write (see execute)
                        if self.metrics is not None:
                            outcome.job = job
                        if limiter is not None or job.ordered or job.key_limited:
                            # Its limit slot and its key's gate pass on once
                            # the outcome is in the table, not when the
                            # function returns: the table never shows more
                            # of a limit or a key RUNNING than may run (the
                            # ack is write-behind, a few milliseconds).
                            outcome.after_written = partial(self._left, job, limiter)
                        self.completer.put(outcome)
                finally:
                    if outcome is None or outcome.after_written is None:
                        self._left(job, limiter)
        except BaseException as exc:
            self.failure = exc
            logger.exception("an executor thread died; the worker stops")
            raise
        finally:
            # This thread's Django connections (a task's ORM, durable
            # records) end with it, not with the process.
            connections.close_all()

    def _left(self, job: ClaimedJob, limiter: "Limiter | None") -> None:
        """The job is done here: its thread left it and, for a gated or
        limited job, its outcome is written. Its limit slots pass to a job
        waiting here or go back (docs/limits.md), its key's next job may
        start, and the fetcher may claim into the room."""
        self.pipeline.buffer.done(job)
        if limiter is not None and limiter.finished(job.id):
            self.pipeline.wake_fetch()
        self.pipeline.slot_freed(job.queue_name)

    def run_job(self, job: ClaimedJob) -> Outcome | None:
        """Start and run one claimed job. An error of shardq's own while
        doing so (an odd row, a receiver that raised) is this job's failure
        (its domain), never the thread's."""
        if tracing.enabled and tracing.active():  # the attempt's span, child of the enqueue's (shardq/tracing.py)
            with tracing.attempt_span(job) as span:
                outcome = self._run_job(job)
                tracing.attempt_ended(span, job, outcome)
                return outcome
        return self._run_job(job)

    def _run_job(self, job: ClaimedJob) -> Outcome | None:
        try:
            with self._isolated(job) as alone:
                if not alone:
                    # Others kept running here past SOLO_WAIT_SECONDS: not
                    # started, back to READY (nothing charged) for later.
                    self.handback.return_jobs([job])
                    return None
                return self.execute(job)
        except Exception as exc:
            if tracing.enabled:
                tracing.record_attempt_error(None, job, exc)
            logger.exception("job %s could not be run", job.id)
            text = sanitize_text(f"shardq could not run job {job.id}: " + "".join(traceback.format_exception(exc)))
            return _failed(job, _class_path(exc), text)

    @contextmanager
    def _isolated(self, job: ClaimedJob) -> Iterator[bool]:
        """Whether ``job`` may start now: a job that lost a worker before
        (``worker_losses``) runs alone in this process, others beside each
        other. A task that kills its process (``os._exit``, a segfault in C
        code) takes every job running beside it down too, and each loss
        counts towards MAX_WORKER_LOSSES: the innocent ones were
        dead-lettered with the culprit. Rerun one at a time, a job lost
        again was lost on its own: the culprit reaches the limit, the others
        finish (and a timeout task reaches its own TaskTimeout).

        The job waits (before its start write: a crash meanwhile charges it
        nothing) for the jobs running here to finish, and new ones wait
        behind it (writer priority); past SOLO_WAIT_SECONDS it goes back
        READY instead (yields False), so a thread stuck in a task cannot
        hold it for ever."""
        if job.worker_losses <= 0 or job.recalled is not None:
            self._solo.acquire_read()
            try:
                yield True
            finally:
                self._solo.release_read()
            return
        if not self._solo.acquire_write(timeout=SOLO_WAIT_SECONDS):
            yield False
            return
        try:
            yield True
        finally:
            self._solo.release_write()

    def execute(self, job: ClaimedJob) -> Outcome | None:
        """Run one job; its outcome for the completer, or None when there is
        nothing to write: the task committed it itself (transactional
        completion), the attempt lost its fence, or the start write found the
        claim superseded (or could not be sent: the job was handed back)."""
        if job.recalled is not None:
            # Ran here under an earlier claim whose outcome was refused
            # (Fetcher.take): the same result under this claim, not a second run.
            return Outcome(
                job.id,
                job.fence,
                job.status_rank + 1,
                "SUCCESSFUL",
                return_value_json=job.recalled,
                shard=job.shard,
                attempts=job.attempts,
            )
        try:
            task = resolve(job.task_path, self.task_modules)
        except UnknownTask:
            # Not this job's failure: a deploy may be under way (new code
            # enqueued a task this worker's code lacks). Handed back for a
            # worker that can run it, no attempt used; dead-lettered, the
            # path named, only after SHARDQ["UNKNOWN_TASK_TIMEOUT"]
            # (handback.py).
            self.handback.defer_unknown([job], self.unknown_task_timeout_seconds)
            return None
        if job.worker_losses and getattr(task, "on_worker_lost", "retry") == "fail":
            # At-most-once: an earlier attempt may have had effects.
            text = (
                f"shardq.exceptions.WorkerLost: attempt {job.attempts} was interrupted by a lost "
                "worker; the task has on_worker_lost='fail', so it is not run again\n"
            )
            return _failed(job, "shardq.exceptions.WorkerLost", text)
        if not self.leaser.trusts(job.shard, job.fence):
            # The lease is lost or unconfirmed: start nothing; hand the claim
            # back (refused harmlessly if it was rescued already).
            self.stats.add("starts_refused")
            self.handback.return_jobs([job])
            if tracing.enabled:
                tracing.note_outcome("handed_back")
            return None
        if job.started:
            # Started by the limited claim that spent its rate token, for a
            # thread idle then: this one (Limiter.rate_only).
            verdict, problem = STARTED, None
        else:
            # Started now, as this thread begins it (group-committed with
            # the threads that begin beside it, starter.py).
            verdict, problem = self.starts.start(job)
        if verdict == LOST:
            # Not an outcome refused (fence_rejections counts those): the job
            # never ran here.
            self.stats.add("starts_refused")
            if tracing.enabled:
                tracing.note_outcome("not_started")
            return None
        if verdict == UNAVAILABLE:
            self.handback.return_jobs([job])
            if tracing.enabled:
                tracing.note_outcome("handed_back")
            return None
        if verdict == REJECTED:
            text = sanitize_text(
                f"shardq.exceptions.UnreadableJob: PostgreSQL refused to start job {job.id}: {problem}\n"
            )
            return _failed(job, "shardq.exceptions.UnreadableJob", text)
        if not self.leaser.trusts(job.shard, job.fence):
            # The lease lapsed since the start was written (the process was
            # paused, the database hung): run nothing on it. The hand-back
            # takes the start back while the shard is still this worker's;
            # after a takeover the row has moved on and it is refused.
            self.stats.add("starts_refused")
            self.handback.return_jobs([job])
            if tracing.enabled:
                tracing.note_outcome("handed_back")
            return None
        rank = job.status_rank + 1
        if job.worker_losses:
            # An earlier attempt recorded no outcome (its worker died or lost
            # the shard): this run repeats work that may have had effects.
            self.stats.add("reexecutions")
        # The TaskResult exists for the task's context and for signal
        # receivers; when neither wants it (a plain task, no receiver but
        # Django's own logging ones, whose records no handler would emit:
        # Django's default logging without DEBUG) it is not built at all
        # (shardq/dispatch.py).
        result = None
        if (
            task.takes_context
            or self.started_gate.other_receivers()
            or self.finished_gate.other_receivers()
            or self.task_log.seen(logging.INFO)
        ):
            result = self._result(task, job)
            task_started.send(sender=self.backend_class(job.backend), task_result=result)
        if self.metrics is not None:
            self.metrics.job_started(job)
        began = time.monotonic()
        state = CommittedByTask()
        controlled: list[Attempt] = []  # the attempt under run control, if any (_call)
        log = None  # what the attempt logged (joblogs.py), once it ended
        try:
            if self._capturing and (task.log if isinstance(task, ShardTask) else True):
                # The attempt is current while its task runs: what it logs
                # is kept with it (joblogs.py). Ended as the call returns: a
                # record logged later (a coroutine cancelled at the deadline
                # that carries on, a thread the task left behind) is not
                # the attempt's.
                scope = CURRENT.get() or thread_scope()
                scope.attempt = (job, task, self.job_log_bytes)
                try:
                    value = self._call(task, job, result, state, controlled)
                finally:
                    scope.attempt = None
                    log = end_attempt(job)
            else:
                value = self._call(task, job, result, state, controlled)
            # Most tasks return None: its JSON needs no encoder.
            return_json = "null" if value is None else self._encode_result(value)
        except BaseException as error:
            # A task's BaseException (KeyboardInterrupt, CancelledError, a
            # sys.exit()) is that job's failure; the worker goes on. Handled
            # inside the except block so task_finished receivers (Django's own
            # logs the traceback from exc_info()) see the exception.
            self._after_call(job, began, failed=True)
            if isinstance(error, DurableStop):
                # Not an outcome: the transition is written already.
                self._durable_stop(job, rank, error)
                return None
            if state.written:
                self.stats.add("succeeded")
                if self.metrics is not None:
                    self.metrics.committed_by_task(job)
                self._finished(result, TaskResultStatus.SUCCESSFUL)
                if tracing.enabled:
                    tracing.note_outcome("succeeded")
                return None
            if controlled and controlled[0].expired:
                self._late(job, error)
                return None
            if isinstance(error, FenceLost):
                # Not an error of the task: this attempt lost the job; its
                # transaction rolled back and nothing of it is written.
                # Where the row reads CLAIMED under this claim (its start
                # write lost with the server), the fenced hand-back puts it
                # back READY to run again; anywhere else it changes nothing.
                self.handback.return_jobs([dataclasses.replace(job, started=False)])
                self.stats.add("fence_rejections")
                if self.metrics is not None:
                    self.metrics.fence_rejected(job)
                logger.warning("job %s: %s", job.id, error)
                if tracing.enabled:
                    tracing.note_outcome("fence_rejected")
                return None
            if result is None and self.finished_gate.needed(logging.ERROR):
                # Only task_finished has a listener for failures (task_started had
                # none, so not sending it was unobservable).
                result = self._result(task, job)
            hidden = sensitive_values(task, job.args, job.kwargs)
            outcome = self._failure(task, job, rank, error, result, hidden)
            if log is not None:
                self._attach_log(outcome, job, log)
            stand_in = None if result is None else _logged_stand_in(error, hidden)
            if stand_in is None:
                self._finished(result, TaskResultStatus(outcome.status))
            else:
                # Django's receiver logs sys.exc_info(): what it sees is the
                # bounded, redacted stand-in, raised here for it.
                try:
                    raise stand_in from None
                except LoggedTaskError:
                    self._finished(result, TaskResultStatus(outcome.status))
            return outcome
        self._after_call(job, began, failed=False)
        if state.written:
            # Committed with the task's own writes (shardq.complete_in_transaction).
            self.stats.add("succeeded")
            if self.metrics is not None:
                self.metrics.committed_by_task(job)
            self._finished(result, TaskResultStatus.SUCCESSFUL)
            if tracing.enabled:
                tracing.note_outcome("succeeded")
            return None
        if controlled and controlled[0].expired:
            self._late(job, None)
            return None
        if result is not None:
            object.__setattr__(result, "_return_value", json.loads(return_json))
        self._finished(result, TaskResultStatus.SUCCESSFUL)
        outcome = Outcome(
            job.id, job.fence, rank, "SUCCESSFUL", return_value_json=return_json, shard=job.shard, attempts=job.attempts
        )
        if log is not None:
            self._attach_log(outcome, job, log)
        return outcome

    def _attach_log(self, outcome: Outcome, job: ClaimedJob, log: AttemptLog | None) -> None:
        """The attempt's log rides on its outcome (nothing when it logged nothing)."""
        if log is not None:
            outcome.log_json = log.entry_json(job.attempts)
            outcome.log_bytes = self.job_log_bytes

    def _encode_result(self, value: object) -> str:
        """The return value as JSON PostgreSQL will store, or the job's error."""
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        if len(text) > self.max_result_bytes:
            raise ResultTooLarge(
                f"the return value is {len(text)} bytes of JSON, over SHARDQ['MAX_RESULT_BYTES'] = "
                f"{self.max_result_bytes}: store large results elsewhere (a model, a file) and return its id"
            )
        if "\\u" in text:
            unstorable = unstorable_json_text(value)
            if unstorable:
                raise ValueError(f"the return value is not storable as JSON in PostgreSQL: {unstorable}")
        return text

    def _after_call(self, job: ClaimedJob, began: float, failed: bool) -> None:
        # Like Django between requests: drop this thread's database connections
        # that broke or outlived CONN_MAX_AGE. After a failure at once (the
        # connection may be unusable); otherwise at most once a second, since
        # the check costs more than a no-op task.
        now = time.monotonic()
        job.ran_seconds = now - began
        if self.metrics is not None:
            self.metrics.job_ran(job, now - began)
        self.pipeline.task_ran(now - began)
        if failed or now >= getattr(self._local, "next_connection_check", 0.0):
            close_old_connections()
            self._local.next_connection_check = now + 1.0

    def _result(self, task: Task, job: ClaimedJob) -> TaskResult:
        return TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            finished_at=None,
            last_attempted_at=job.last_attempted_at,
            args=job.args,
            kwargs=job.kwargs,
            backend=job.backend,
            errors=[TaskError(**e) for e in job.errors] if job.error_count else [],
            worker_ids=job.worker_ids,
        )

    def backend_class(self, alias: str) -> type[BaseTaskBackend]:
        """The class of the configured backend ``alias`` (Django's signals'
        sender, as the backend itself sends them): looked up in
        ``django.tasks.task_backends``, so the worker needs no import of
        shardq's backend and a subclass configured in TASKS is the sender."""
        found = self._backend_classes.get(alias)
        if found is None:
            try:
                found = type(task_backends[alias])
            except InvalidTaskBackend:  # not configured in this process: the row names another project's
                found = BaseTaskBackend
            self._backend_classes[alias] = found
        return found

    def _finished(self, result: TaskResult | None, status: TaskResultStatus) -> None:
        if result is None:
            return
        object.__setattr__(result, "status", status)
        if status != TaskResultStatus.READY:  # a retry has not finished
            object.__setattr__(result, "finished_at", timezone.now())
        task_finished.send(sender=self.backend_class(result.backend), task_result=result)

    def _call(
        self, task: Task, job: ClaimedJob, result: TaskResult | None, state: CommittedByTask, controlled: list[Attempt]
    ) -> Any:
        args, kwargs = job.args, job.kwargs
        if not isinstance(args, list):
            _bad_payload("args", args, list)
        if not isinstance(kwargs, dict):
            _bad_payload("kwargs", kwargs, dict)
        if job.payload_bytes > self.max_payload_bytes:
            # enqueue refuses such calls; a row written another way is not run.
            raise ValueError(
                f"the job's arguments are {job.payload_bytes} bytes of JSON, over "
                f"SHARDQ['MAX_PAYLOAD_BYTES'] = {self.max_payload_bytes}: not run. Store large data "
                "elsewhere (a model, a file) and pass its id."
            )
        is_async = _is_async.get(task.func)
        if is_async is None:
            is_async = _is_async[task.func] = iscoroutinefunction(task.func)
        limit = self._timeout_of(task)
        if limit is None and not task.takes_context and not is_async:
            # Nothing can observe a deadline or a cancel: no run control.
            return task.func(*args, **kwargs)
        if is_async and self.loop is None:
            raise RuntimeError("the executor runs async tasks only once started")
        # The deadline counts from here, the task's real start.
        attempt = self.control.begin(
            job, task, job.status_rank + 1, limit, is_async=is_async, observes_cancel=task.takes_context or is_async
        )
        controlled.append(attempt)
        durable = None
        try:
            if task.takes_context:
                durable = (
                    None
                    if is_async
                    else DurableRun(
                        job_id=job.id,
                        fence=job.fence,
                        rank=job.status_rank + 1,
                        shard=job.shard,
                        using=self._database_of(job.backend),
                        idle_ms=int(self.lease_ttl_seconds * 1000),
                        boundary=partial(self._boundary, job, attempt),
                    )
                )
                args = [
                    ShardqTaskContext(
                        task_result=result,
                        fence=job.fence,
                        shard=job.shard,
                        rank=job.status_rank + 1,
                        completion_state=state,
                        control=attempt,
                        durable=durable,
                        is_async=is_async,
                    ),
                    *args,
                ]
            if is_async:
                assert self.loop is not None
                coroutine = task.func(*args, **kwargs)
                scope = CURRENT.get()
                if scope is not None and scope.attempt is not None and self._loop_thread is not None:
                    # Its records are this attempt's, in a scope of its own
                    # on the loop's thread (joblogs.py).
                    coroutine = scoped(coroutine, scope.attempt, self._loop_thread.ident or 0)
                future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
                # Cancelled at the deadline or on a cancel (runcontrol.py):
                # this thread is free at once, the coroutine gets
                # CancelledError at its next await.
                self.control.attach(attempt, future)
                return future.result()
            return task.func(*args, **kwargs)
        finally:
            if durable is not None:
                # A batch left open (the task raised or returned inside
                # it) rolls back; its cursor stays where the last one left it.
                durable.close()
                if durable.batches_run:
                    self.stats.add("durable_batches", durable.batches_run)
            # Out of the task: no TaskTimeout may be sent from now on. One
            # sent at the deadline can still be raised here, between the
            # task's return and end() taking the attempt's lock: caught, and
            # end() runs again (attempt.expired says what happened, not the
            # exception; only the first of these lines can see it).
            while True:
                try:
                    self.control.end(attempt)
                    break
                except TaskTimeout:
                    continue

    def _database_of(self, alias: str) -> str:
        """The database of shardq's tables for backend ``alias``."""
        try:
            return getattr(task_backends[alias], "database_alias", "default")
        except InvalidTaskBackend:
            return "default"

    def _boundary(self, job: ClaimedJob, attempt: Attempt) -> str | None:
        """Why a durable job must stop at its next boundary, or None:
        cancelled (its outcome is written already), the worker stopping or
        recycling, or its shard draining or no longer trusted here (handed
        over). Reads flags only: called between every step and batch."""
        if attempt.cancelled:
            return "cancel"
        if self._stop.is_set() or self.leaser.shutting_down or self.control.recycle_reason is not None:
            return "shutdown"
        if job.shard in self.leaser.draining or not self.leaser.trusts(job.shard, job.fence):
            return "handover"
        return None

    def _durable_stop(self, job: ClaimedJob, rank: int, stop: DurableStop) -> None:
        """A durable job ended its attempt at a boundary: write the
        transition now, on this thread (the limit slot and the thread pass
        on only once it is in the table). Suspended: SUSPENDED until its
        time or signal; interrupted: READY at once for the next owner
        (shutdown, handover) or nothing (a cancel wrote FAILED). Either way
        the attempt is taken back (docs/durable.md, "Attempts")."""
        if isinstance(stop, Interrupted) and stop.reason == "cancel":
            self.stats.add("durable_cancelled")
            logger.info("job %s stopped at a boundary: cancelled", job.id)
            return
        using = self._database_of(job.backend)
        params = {
            "id": job.id,
            "fence": job.fence,
            "rank": rank,
            "shard": job.shard,
            "idle_ms": int(self.lease_ttl_seconds * 1000),
            "channel": self.pipeline.config.settings.channel,
            "notify": self.pipeline.config.settings.notify,
        }
        try:
            with transaction.atomic(using=using):
                held = operations.run("lock_running_job", params, using=using, fetch="one")
                row = None
                if held is not None:
                    if isinstance(stop, Suspended):
                        params.update(until=stop.until, wait_name=stop.wait_name)
                        row = operations.run("suspend_job", params, using=using, fetch="one")
                    else:
                        row = operations.run("yield_job", params, using=using, fetch="one")
        except Exception as exc:
            # The database is away: the job stays RUNNING under this claim,
            # and its shard's next owner rescues it (its records are kept).
            logger.warning("job %s: could not write its %s (%s)", job.id, stop, exc)
            close_old_connections()
            return
        if row is None:
            self.stats.add("fence_rejections")
            logger.warning("job %s: %s refused: this attempt no longer holds the job", job.id, stop)
            return
        if isinstance(stop, Suspended):
            self.stats.add("suspended")
            if row[0] == "SUSPENDED":
                if job.ordered:
                    # Its key's next job may be buffered here behind it: the
                    # key's gate opens when this thread leaves the job. The
                    # shard's buffered jobs go back READY first, and the
                    # claim passes over the key's jobs while this one is
                    # suspended (docs/durable.md, "Ordered keys").
                    self.leaser.recall_buffered(job.shard)
                self.pipeline.suspended()
            logger.info("job %s (%s) %s", job.id, job.task_path, stop)
        else:
            self.stats.add("handed_back_at_boundary")
            logger.info("job %s (%s) handed back at a boundary (%s)", job.id, job.task_path, stop)

    def _timeout_of(self, task: Task) -> float | None:
        """The attempt's time limit: the task's ``timeout`` (validated when
        it was defined), else ``SHARDQ["TASK_TIMEOUT"]``."""
        timeout = getattr(task, "timeout", None)
        if timeout is None:
            return self.default_timeout_seconds
        return timeout_seconds(timeout, "timeout")

    def _timed_out(self, attempt: Attempt) -> None:
        """At the deadline (run control's thread, under the attempt's lock):
        queue the attempt's outcome, FAILED with TaskTimeout or READY for a
        retry while attempts remain, under its fence and rank."""
        job, task = attempt.job, attempt.task
        how = "its coroutine was cancelled" if attempt.is_async else "TaskTimeout was raised in its thread"
        error = TaskTimeout(f"job {job.id} ran past its timeout of {attempt.timeout_seconds:g}s; {how}")
        outcome = self._failure(task, job, attempt.rank, error, None)
        outcome.extra["timed_out"] = True
        # What the task logged until its deadline (the log closes now: a
        # stuck thread's later records are not the attempt's).
        self._attach_log(outcome, job, end_attempt(job))
        if self.metrics is not None:
            outcome.job = job
        self.completer.put(outcome)

    def _late(self, job: ClaimedJob, error: BaseException | None) -> None:
        """A timed-out attempt ended: its outcome was written at the deadline,
        so whatever it produced now is dropped (the database would refuse it
        too: the same rank). A return or another exception is a late
        completion, counted; the TaskTimeout (or the cancel) we sent is not."""
        if tracing.enabled:
            tracing.note_outcome("timed_out")
        if error is None or not isinstance(error, (TaskTimeout, asyncio.CancelledError, CancelledError)):
            self.stats.add("late_completions_refused")
            logger.warning(
                "job %s ended after its timeout (%s); its outcome was written at the deadline: refused",
                job.id,
                "returned" if error is None else _exception_line(error),
            )

    def _failure(
        self,
        task: Task,
        job: ClaimedJob,
        rank: int,
        error: BaseException,
        result: TaskResult | None,
        hidden: Sequence[str] = (),
    ) -> Outcome:
        if tracing.enabled:  # on the attempt's span (none on run control's thread, at a deadline)
            tracing.record_attempt_error(task, job, error)
        path = _class_path(error)
        # Bounded (sanitize_text) and with sensitive argument values hidden:
        # the admin shows it to every viewer of the job.
        text = sanitize_text("".join(traceback.format_exception(error)))
        if hidden:
            text = redact_text(text, hidden)
        if (
            isinstance(error, (TypeError, ValueError))
            and "JSON" in str(error)
            and "is not JSON serializable" in str(error)
        ):
            text = f"the return value is not JSON ({error}); return str, int, float, bool, None, list or dict\n" + text
        if result is not None:
            result.errors.append(TaskError(exception_class_path=path, traceback=text))
        # Never retry a BaseException that is not an Exception (KeyboardInterrupt,
        # SystemExit, CancelledError): it is the job's failure, not a transient one.
        retry = isinstance(task, ShardTask) and job.attempts < job.max_attempts and isinstance(error, Exception)
        # One line a failed attempt, whatever the project's LOGGING: the job,
        # the task and the exception (the traceback is in the job's errors).
        failed = (
            f"job {job.id} ({job.task_path}) failed: {_exception_line(error, hidden)}; "
            f"attempt {job.attempts} of {job.max_attempts}"
        )
        if retry:
            backoff = task.backoff or DEFAULT_BACKOFF
            delay = backoff.delay(job.attempts)
            logger.warning("%s, retrying in %.1fs", failed, delay)
            return Outcome(
                job.id,
                job.fence,
                rank,
                "READY",
                error_json=Outcome.error(path, text),
                delay=delay,
                shard=job.shard,
                attempts=job.attempts,
            )
        logger.error("%s, no retry left: FAILED", failed)
        return Outcome(
            job.id,
            job.fence,
            rank,
            "FAILED",
            error_json=Outcome.error(path, text),
            shard=job.shard,
            attempts=job.attempts,
        )


# Task function -> is it async? (inspect's answer costs a microsecond a job.)
_is_async: dict[Callable[..., Any], bool] = {}


def _bad_payload(name: str, value: object, expected: type) -> NoReturn:
    raise TypeError(f"the job's {name} are a {type(value).__name__} in the table, not a {expected.__name__}")


def _failed(job: ClaimedJob, class_path: str, text: str) -> Outcome:
    """The outcome of a job failed without a result of its task: FAILED
    under this claim, the error recorded."""
    return Outcome(
        job.id,
        job.fence,
        job.status_rank + 1,
        "FAILED",
        error_json=Outcome.error(class_path, text),
        shard=job.shard,
        attempts=job.attempts,
    )
