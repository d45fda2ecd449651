"""The one shape of a worker service: a name, one thread, start, stop by a
deadline, and a failure the worker watches.

The leaser, fetcher, listener, starter, completer, scheduler and gauges each
run one daemon thread through this base (the executor runs a pool of threads
and keeps the same interface). A service whose thread dies records the
exception in ``failure``; ``Worker.run`` checks every service's ``failure``
twice a second and shuts the worker down loudly, so no thread dies silently.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("shardq.worker")

# How long ``stop()`` without a deadline waits for the thread to end.
DEFAULT_STOP_SECONDS = 10.0


class Service:
    """One worker thread. Subclasses set ``name`` and implement ``run``, which
    loops until ``stopping``; ``interrupt`` wakes whatever ``run`` waits on,
    and ``after_stop`` finishes the work left once the thread has ended."""

    name = "service"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    # -- the interface the worker uses -------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"shardq-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, deadline: float | None = None) -> None:
        """Ask the thread to stop, wait for it until ``deadline`` (monotonic;
        None: DEFAULT_STOP_SECONDS from now), then finish what is left."""
        if deadline is None:
            deadline = time.monotonic() + DEFAULT_STOP_SECONDS
        self._stop.set()
        self.interrupt()
        if self._thread is not None:
            self._thread.join(timeout=max(0.1, deadline - time.monotonic()))
        self.after_stop(deadline)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- what a service implements ---------------------------------------------------

    def run(self) -> None:
        raise NotImplementedError

    def interrupt(self) -> None:
        """Wake the thread from whatever it waits on (it then sees ``stopping``)."""

    def after_stop(self, deadline: float) -> None:
        """Runs in the stopping thread once the service's thread has ended (or the deadline passed)."""

    def finished(self) -> None:
        """Runs in the service's own thread as it ends, however it ends."""

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # a dead service must stop the worker loudly
            # Logged once here, with its traceback; the worker sees
            # ``failure`` and shuts down (re-raising would only print the
            # traceback a second time, through threading.excepthook).
            self.failure = exc
            logger.exception("the %s died; the worker stops", self.name)
        finally:
            self.finished()
