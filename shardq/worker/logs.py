"""What a worker prints, whatever the project's ``LOGGING``.

Django's default logging sends nothing of the ``shardq`` logger anywhere
below WARNING, and that without a time. ``ensure_output()`` gives the
``shardq`` logger a stderr handler when no handler would receive its records
(neither its own nor the root's): then a worker of a new project prints its
start, shard changes, signals, failed jobs and stop. A project that
configures ``LOGGING`` for ``shardq`` or for the root logger is left alone.
"""

import logging
import os
import sys
import time
from collections.abc import Iterable

FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def ensure_output() -> None:
    """A stderr handler at INFO on the ``shardq`` logger, unless one would get its records."""
    logger = logging.getLogger("shardq")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def dump_stacks_on(signum: int) -> None:
    """``kill -USR1 <pid>`` prints every thread's stack to stderr and the
    worker carries on. An operator asks a worker that does not stop, or does
    not claim, where it is; without this SIGUSR1's default action kills it.

    A Python handler, run by the main thread between two bytecodes, reading
    ``sys._current_frames()``: faulthandler's C dump of every thread reads
    other threads' frames while they run and crashed a busy worker with
    SIGSEGV in the tests. The text goes out with ``os.write`` on fd 2, no
    lock of Python's stream or logging taken (the main thread may hold one)."""
    import signal

    def dump(received: int, frame: object) -> None:
        try:
            os.write(2, stacks_text().encode("utf-8", "replace"))
        except OSError:
            pass  # stderr gone: nothing to tell, and the worker must go on

    try:
        signal.signal(signum, dump)
    except (ValueError, OSError):
        pass  # not the main thread (an embedded worker): the default action stays


def stacks_text() -> str:
    """Every thread of this process with its stack (most recent call last)."""
    import threading
    import traceback

    frames = sys._current_frames()
    threads = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = [f"Stacks of process {os.getpid()} (SIGUSR1), {len(frames)} thread(s):\n"]
    for ident, frame in frames.items():
        parts.append(f'Thread 0x{ident:x} "{threads.get(ident, "?")}" (most recent call last):\n')
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


def tidy_django_task_log() -> None:
    """Django's own ``django.tasks`` lines in the worker's format.

    Under Django's default logging with ``DEBUG``, the ``django`` logger's
    ``console`` handler prints Django's task lines ("Task id=... state=...")
    bare, with no time or process, between the worker's own timed lines.
    When that is the set-up (a formatter-less ``console`` handler on
    ``django``, no handler on ``django.tasks`` or the root: nothing the
    project configured), ``django.tasks`` gets a handler of its own in
    ``FORMAT``, still only under ``DEBUG``, and the ``django`` logger's other
    handlers (``mail_admins`` for a failure without ``DEBUG``); it no longer
    propagates, so each line is printed once. Anything else is left alone.
    """
    from django.utils.log import RequireDebugTrue

    tasks_logger = logging.getLogger("django.tasks")
    django_logger = logging.getLogger("django")
    if tasks_logger.handlers or not tasks_logger.propagate or logging.getLogger().handlers:
        return
    bare = [h for h in django_logger.handlers if h.get_name() == "console" and h.formatter is None]
    if not bare:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(bare[0].level)
    handler.addFilter(RequireDebugTrue())
    tasks_logger.addHandler(handler)
    for other in django_logger.handlers:
        if other not in bare:
            tasks_logger.addHandler(other)
    tasks_logger.propagate = False


def shard_ranges(shards: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` as ``"0-3,7,9-10"``: 64 shards fit a log line."""
    ordered = sorted(set(shards))
    parts = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts) or "none"


def process_age_seconds() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as stat:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return max(0.0, up - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class BootClock:
    """A worker's boot, by stage (the INFO line "boot: ..."): the process's
    start to ``Worker.run`` (Python, Django and the project's imports), then
    each stage ``mark``ed since the one before."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        age = process_age_seconds()
        self.stages: list[tuple[str, float]] = [] if age is None else [("process start to run", age)]
        self._last = self.began

    def mark(self, stage: str) -> None:
        now = time.monotonic()
        self.stages.append((stage, now - self._last))
        self._last = now

    def summary(self) -> str:
        parts = [f"{stage} {seconds * 1000:.0f} ms" for stage, seconds in self.stages]
        total = sum(seconds for _, seconds in self.stages)
        return f"{', '.join(parts)} ({total * 1000:.0f} ms in all)"
