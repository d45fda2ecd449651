"""Per-job logs: what a task logs during its attempt, kept with that attempt.

One handler (``JobLogHandler``) sits on the root logger while a worker
runs. ``CURRENT``, a contextvar, holds a ``Scope``: the attempt running
there (its job, task and bound) and the thread it runs on. Each executor
thread has one scope for good, whose attempt is set around the task's call
(two attribute writes a job: a contextvar's own set and reset cost more than
a no-op job can spare). An ``async def`` task's coroutine runs in a scope of
its own, made for the attempt (``scoped``): asyncio gives each of its tasks a
copy of the context, so the coroutine, and the asyncio tasks it creates, see
that scope, never the next job's. The attempt's ``AttemptLog`` is made at its
first record (``job.attempt_log``). The handler appends a record only under an
attempt whose log is open and only on the scope's thread: a record of another
thread (a fresh context holds no scope; one that copied the context is not
the scope's thread), of the worker's own ``shardq`` loggers, or logged once
the attempt ended (``end_attempt``) is not attached. The attempt's text
rides on its outcome, written by the completer's one ``complete_jobs``
statement: no statement of its own.

Levels. Under Django's default ``LOGGING`` the root logger is at WARNING, so
a task's ``logging.getLogger(__name__).info(...)`` is dropped before any
handler sees it. To keep INFO lines (``SHARDQ["JOB_LOG_LEVEL"]``) the root
logger is lowered to that level while the handler is installed, and every
handler the project configured gets a filter that drops what it would not
have received before: a record below the old root level from a logger whose
level is inherited from the root. So the project's handlers print exactly
what they printed; a logger the project gave a level of its own keeps it
(``"myapp": {"level": "WARNING"}`` keeps ``myapp``'s INFO lines out of the
job's log too). With no handler of the project's on the way, logging's last
resort (WARNING and above to stderr) still prints: the handler passes such a
record on to it, as logging itself would have.

Bounds. An attempt keeps at most ``SHARDQ["JOB_LOG_BYTES"]`` bytes of UTF-8
text; what does not fit is cut and the cut is marked ("… N bytes cut"). The
job's attempts together keep within the same bound: the completer's SQL
replaces the oldest attempts' text by such a mark when a retry's log would
pass it. Sensitive argument values (``sensitive=``) are replaced by
``[redacted]`` in each record before it is kept; NUL characters and lone
surrogates are escaped (PostgreSQL's jsonb refuses them).
"""

import contextvars
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

from ..tasks.redaction import redact_text, sensitive_values


class Scope:
    """Where a task's records go: ``attempt`` is (job, task, bound in bytes)
    of the attempt running on ``thread``, or None between attempts. Its log
    is ``job.attempt_log``: None until its first record, CLOSED once the
    attempt ended without one."""

    __slots__ = ("attempt", "thread")

    def __init__(self, thread: int, attempt: tuple[Any, Any, int] | None = None) -> None:
        self.thread = thread
        self.attempt = attempt


CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("shardq_job_log", default=None)
CLOSED: Any = object()


def thread_scope() -> Scope:
    """This thread's scope (an executor thread's, made at its first job)."""
    scope = CURRENT.get()
    if scope is None or scope.thread != threading.get_ident():
        scope = Scope(threading.get_ident())
        CURRENT.set(scope)
    return scope


async def scoped(coroutine: Any, attempt: tuple[Any, Any, int], thread: int) -> Any:
    """Await an async task's coroutine in a scope of its own (set in the
    asyncio task's own copy of the context), on the loop's ``thread``."""
    CURRENT.set(Scope(thread, attempt))
    return await coroutine


FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Room kept for the cut mark ("\n… 123456789 bytes cut"), so that text and
# mark together stay within the bound.
MARK_ROOM = 40


def cut_mark(cut_bytes: int) -> str:
    return f"\n… {cut_bytes} bytes cut"


def storable(text: str) -> str:
    """``text`` as PostgreSQL's jsonb stores it: NUL written ``\\x00``, a
    lone surrogate as its ``\\udXXX`` escape."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# Taken to add to or close an attempt's log that holds records.
_LOCK = threading.Lock()


class AttemptLog:
    """The log of one attempt: formatted records, at most ``limit`` bytes.

    Appended to by the task's thread (or its coroutines, on the async
    loop's thread; or ``asyncio.to_thread``, which copies the context), so
    appends take a lock: one for every attempt's log (``_LOCK``), since an
    attempt that logs nothing, the usual one, should not pay for a lock of
    its own."""

    __slots__ = ("_hidden", "_text", "cut", "job", "limit", "open", "parts", "task", "used")

    def __init__(self, limit: int, task: Any, job: Any) -> None:
        self.limit = limit
        # The task and the job (its arguments are decoded only if it logs).
        self.task = task
        self.job = job
        self.parts: list[bytes] = []
        self.used = 0
        self.cut = 0
        self.open = True
        self._hidden: Sequence[str] | None = None
        self._text: str | None = None

    def hidden(self) -> Sequence[str]:
        """The sensitive argument values to redact (found at the first
        record), as ``storable`` writes them: redacted after the escapes, a
        value cannot appear again through one (``0`` in ``\\x00``)."""
        if self._hidden is None:
            try:
                values = sensitive_values(self.task, self.job.args, self.job.kwargs)
            except Exception:  # an odd row's arguments: hide nothing rather than fail the record
                values = []
            self._hidden = sorted({storable(v) for v in values}, key=len, reverse=True)
        return self._hidden

    def add(self, line: str) -> None:
        line = storable(line)
        hidden = self.hidden()
        if hidden:
            line = redact_text(line, hidden)
        data = (line if not self.parts else "\n" + line).encode("utf-8")
        with _LOCK:
            if not self.open:
                return
            room = self.limit - self.used
            if len(data) <= room:
                self.parts.append(data)
                self.used += len(data)
            else:
                if room > 0:
                    self.parts.append(data[:room])
                    self.used = self.limit
                self.cut += len(data) - max(room, 0)

    def close(self) -> str | None:
        """End the attempt's log: nothing is added from now on. Its text
        (the cut marked), or None when the task logged nothing."""
        if not self.parts:
            # Logged nothing (a record racing with the attempt's end is not
            # the attempt's): no lock taken.
            self.open = False
            return self._text
        with _LOCK:
            if not self.open:
                return self._text
            self.open = False
            data = b"".join(self.parts)
            cut = self.cut
            self.parts = []
            self._text = self._finish(data, cut)
            return self._text

    def _finish(self, data: bytes, cut: int) -> str:
        if cut:
            # Room for the mark: the text and its mark stay within the bound.
            keep = max(0, min(len(data), self.limit - MARK_ROOM))
            cut += len(data) - keep
            data = data[:keep]
        # A cut may split a character: its bytes are dropped (and counted).
        text = data.decode("utf-8", "ignore")
        if cut:
            cut += len(data) - len(text.encode("utf-8"))
            text += cut_mark(cut)
        return text

    def entry_json(self, attempt: int) -> str | None:
        """The attempt's entry of the job's ``logs`` (JSON), or None: nothing logged."""
        text = self.close()
        if text is None:
            return None
        return json.dumps({"attempt": attempt, "text": text})


def end_attempt(job: Any) -> AttemptLog | None:
    """The attempt of ``job`` ended: its log takes nothing more. The log,
    or None when the task logged nothing."""
    log = job.attempt_log
    if log is None:
        # No lock: a record that races with the attempt's end (from a
        # thread or coroutine the task left running) is not the attempt's.
        job.attempt_log = CLOSED
        return None
    if log is CLOSED:
        return None
    log.close()
    return log


class _KeepOutput(logging.Filter):
    """On each of the project's handlers while the root logger is lowered:
    lets through only what the handler got before, i.e. drops a record below
    the old root level whose logger inherits the root's level."""

    def __init__(self, old_root_level: int) -> None:
        super().__init__()
        self.old_root_level = old_root_level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.old_root_level:
            return True
        return not _inherits_root_level(record.name)


def _inherits_root_level(name: str) -> bool:
    """Is the effective level of logger ``name`` the root logger's?"""
    logger: logging.Logger | None = logging.getLogger(name) if name != "root" else logging.getLogger()
    while logger is not None:
        if logger.parent is None:  # the root itself
            return True
        if logger.level:
            return False
        logger = logger.parent
    return True


def _has_other_handler(name: str, own: logging.Handler) -> bool:
    """Would logging have found a handler but ``own`` for a record of ``name``
    (the test ``Logger.callHandlers`` makes before its last resort)?"""
    logger: logging.Logger | None = logging.getLogger(name) if name != "root" else logging.getLogger()
    while logger is not None:
        if any(handler is not own for handler in logger.handlers):
            return True
        logger = logger.parent if logger.propagate else None
    return False


class JobLogHandler(logging.Handler):
    """Appends a record to the current attempt's log (see the module docstring)."""

    # dispatch.record_is_seen: this handler emits nothing of the worker's own
    # (Django's task signals are sent outside any attempt), so it neither
    # counts as a receiver nor hides logging's last resort.
    captures_job_logs = True

    def __init__(self, level: int) -> None:
        # The handler's own level lets the last resort's WARNING through
        # whatever JOB_LOG_LEVEL is; ``capture_level`` decides what is kept.
        super().__init__(min(level, logging.WARNING))
        self.capture_level = level
        self.setFormatter(logging.Formatter(FORMAT))

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock: each attempt's log has its own, and one lock for
        # every thread's records would serialise the executors' logging.
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        last_resort = logging.lastResort
        if (
            last_resort is not None
            and record.levelno >= last_resort.level
            and not _has_other_handler(record.name, self)
        ):
            # This handler on the root would hide logging's last resort from
            # a project with no handler: the record goes there, as before.
            last_resort.handle(record)
        scope = CURRENT.get()
        if scope is None or record.levelno < self.capture_level:
            return
        attempt = scope.attempt
        if attempt is None or scope.thread != threading.get_ident():
            return  # between attempts, or a thread that copied the context
        if record.name == "shardq" or record.name.startswith("shardq."):
            return  # the worker's own lines, not the task's
        job, task, limit = attempt
        log = job.attempt_log
        if log is None:
            with _LOCK:
                log = job.attempt_log
                if log is None:
                    log = job.attempt_log = AttemptLog(limit, task, job)
        if log is CLOSED or not log.open:
            return
        try:
            line = self.format(record)
        except Exception as exc:  # bad %-arguments, a __str__ that raises: the task's code
            line = _unformattable(record, exc)
        log.add(line)


def _unformattable(record: logging.LogRecord, exc: Exception) -> str:
    """The line kept for a record whose formatting raised: the logger, the
    error and what was logged, each bounded, none of it raising again."""
    try:
        why = f"{type(exc).__name__}: {exc}"[:500]
    except Exception:
        why = type(exc).__name__
    try:
        shown = f"{record.msg!r} % {record.args!r}"[:500]
    except Exception:
        shown = f"a {type(record.msg).__name__} message"
    return f"{record.levelname} {record.name}: <the record could not be formatted ({why}): {shown}>"


class Capture:
    """The installed handler and the root level it lowered, shared by the
    executors of this process (installed by the first, removed by the last)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self.handler: JobLogHandler | None = None
        self._lowered_from: int | None = None
        self._filtered: list[tuple[logging.Handler, _KeepOutput]] = []

    def install(self, level: int) -> None:
        with self._lock:
            self._users += 1
            if self._users > 1:
                return
            root = logging.getLogger()
            handler = JobLogHandler(level)
            if root.getEffectiveLevel() > level:
                old = root.level
                for ref in list(logging._handlerList):  # type: ignore[attr-defined]
                    other = ref()
                    if other is None or other is handler:
                        continue
                    keep = _KeepOutput(old)
                    other.addFilter(keep)
                    self._filtered.append((other, keep))
                self._lowered_from = old
                root.setLevel(level)
            root.addHandler(handler)
            self.handler = handler

    def uninstall(self) -> None:
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users or self.handler is None:
                return
            root = logging.getLogger()
            root.removeHandler(self.handler)
            self.handler = None
            if self._lowered_from is not None:
                root.setLevel(self._lowered_from)
                self._lowered_from = None
            for other, keep in self._filtered:
                other.removeFilter(keep)
            self._filtered.clear()


CAPTURE = Capture()
