"""The shutdown signal rule, shared by the worker process and the supervisor.

State model of one process::

    running ──SIGTERM / SIGINT / SIGHUP──▶ stopping (graceful: finish, release, exit 0)
       │                                     │  same again within DUPLICATE_SECONDS: ignored
       │                                     └─ any of them again later ─▶ now
       └──────────────SIGQUIT (always)──────────────────────────────────▶ now

*Now* means exit at once, non-zero: running jobs are abandoned (each attempt
becomes a worker loss once its shard's lease expires and is taken over).

Why a duplicate window: one stop request often arrives twice — systemd's
default ``KillMode=control-group`` sends SIGTERM to every process of the
service and the supervisor forwards it as well; a terminal's Ctrl-C and a
``kill -TERM -- -PGID`` reach every member of the process group. A second
signal within DUPLICATE_SECONDS of the first is taken as that same request,
never as "now". (The supervisor puts each child in its own process group, so
group signals reach only the supervisor, which forwards them once; the window
covers the signals that still arrive twice.)

A process installs the handlers as early as it can (a forked child before
it builds its worker): a signal that arrives before the worker exists is
remembered and applied when the worker binds.
"""

import logging
import os
import signal
import time
from collections.abc import Callable

logger = logging.getLogger("shardq.worker")

GRACEFUL = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
NOW = (signal.SIGQUIT,)
HANDLED = GRACEFUL + NOW
DUPLICATE_SECONDS = 1.0


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class ShutdownSignals:
    """Turns SIGTERM/SIGINT/SIGHUP/SIGQUIT into ``graceful`` or ``now`` calls."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.first: tuple[int, float] | None = None  # (signal, when) of the stop request
        self._graceful: Callable[[int], None] | None = None
        self._now: Callable[[int], None] | None = None
        self.pid = os.getpid()

    def install(self) -> "ShutdownSignals":
        for signum in HANDLED:
            signal.signal(signum, self.handle)
        return self

    def bind(self, graceful: Callable[[int], None], now: Callable[[int], None]) -> None:
        """Act on the signals from here on; a stop requested before is applied now."""
        self._graceful, self._now = graceful, now
        if self.first is not None:
            graceful(self.first[0])

    def handle(self, signum: int, frame: object = None) -> None:
        at = self.clock()
        if signum in NOW:
            self._exit_now(signum)
            return
        if self.first is None:
            self.first = (signum, at)
            if self._graceful is not None:
                self._graceful(signum)
            return
        if at - self.first[1] < DUPLICATE_SECONDS:
            # The same stop request delivered twice (group + forward, systemd's
            # control group): not a second signal.
            logger.info(
                "%s within %.0fs of %s: the same stop request, ignored",
                signal_name(signum),
                DUPLICATE_SECONDS,
                signal_name(self.first[0]),
            )
            return
        self._exit_now(signum)

    def _exit_now(self, signum: int) -> None:
        if self._now is not None:
            self._now(signum)
        else:  # nothing started yet: nothing to abandon
            os._exit(1)


_installed: ShutdownSignals | None = None


def install() -> ShutdownSignals:
    """This process's rule, installed once (a forked child installs its own)."""
    global _installed
    if _installed is None or _installed.pid != os.getpid():
        _installed = ShutdownSignals().install()
    return _installed
