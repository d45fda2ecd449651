"""``--processes N``: run N worker processes and restart any that crashes.

Each child is forked from the supervisor after Django is set up (no
re-import, no second round of system checks; database connections are closed
before the fork, so none is shared) and runs one ``Worker`` with its own
incarnation id, leases and connections. A child that exits non-zero while
the supervisor is not stopping is restarted, with a backoff per process
slot: at once after a run of at least ``stable_seconds`` (60 s), then after
1 s, 2 s, 4 s ... up to ``RESTART_DELAY_CAP`` (30 s) while it keeps dying
sooner, so a worker that dies at once on start (a bug, a database it
cannot use) costs a restart every 30 s, not one a second; each restart is
logged with its delay. A child replaced because of zombie threads exits
``EXIT_RECYCLE`` (3).

Signals. Each child runs in a process group of its own, so a signal sent to
the supervisor's group (a terminal's Ctrl-C, ``kill -TERM -- -PGID``) reaches
the supervisor only, and the supervisor is the one that passes signals on,
each once: a child that got the group's signal *and* the forwarded one would
take the second for "exit now". The rule (shutdown.py) is the worker's:
SIGTERM, SIGINT or SIGHUP stops gracefully (forwarded as is; the supervisor
exits 0 when every child did); the same again within a second is the same
request; a later one, or SIGQUIT, means now: every child gets SIGQUIT and
exits at once, and so does the supervisor, non-zero. Signals are blocked
around each fork, so a child never misses a forward sent while it was being
started, and a signal that reaches a child before it joined its own group
counts as that same request.
"""

import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable

from . import shutdown as shutdown_signals
from .runcontrol import EXIT_RECYCLE
from .shutdown import HANDLED, signal_name

logger = logging.getLogger("shardq.worker.supervisor")

PR_SET_PDEATHSIG = 1

# Restart backoff (per process slot): the first restart after a stable run
# is at once; each further crash within STABLE_SECONDS of its start doubles
# the delay from RESTART_DELAY_BASE up to RESTART_DELAY_CAP.
RESTART_DELAY_BASE = 1.0
RESTART_DELAY_CAP = 30.0
STABLE_SECONDS = 60.0
# How often the supervisor looks at its children (and at restarts due).
POLL_SECONDS = 0.2


def restart_delay(quick_crashes: int, base: float = RESTART_DELAY_BASE, cap: float = RESTART_DELAY_CAP) -> float:
    """The wait before a restart after ``quick_crashes`` crashes in a row
    that each came sooner than the stable time after their start (this one
    included): 0 for the first, then base, 2 base, 4 base ... at most cap."""
    if quick_crashes <= 1:
        return 0.0
    return min(cap, base * 2 ** min(quick_crashes - 2, 62))


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the supervisor dies (Linux), so a killed
    supervisor never leaves orphan workers holding leases."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: orphans then stop on their own SIGTERM only


class ForkedChild:
    """One worker process forked from the supervisor (Popen-like: poll, send_signal)."""

    def __init__(self, run_child: Callable[[], int], env: dict[str, str]) -> None:
        from django.db import connections

        connections.close_all()  # a connection must never be shared across a fork
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked from before the fork until the child has its own group and
        # handlers (in the child) and is in ``children`` (in the supervisor,
        # see Supervisor._spawn): a stop signal can never fall in between.
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                os.setpgid(0, 0)  # its own process group: group signals stay with the supervisor
                # Its own rule, before unblocking: a signal pending from while
                # it was in the supervisor's group is taken as a stop request
                # and the supervisor's forward of it as the same request.
                shutdown_signals.install()
                signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
                _die_with_parent()
                random.seed()  # siblings must not share backoff jitter
                os.environ.update(env)
                code = run_child()
            except BaseException:
                logger.exception("worker process failed")
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.pid = pid
        self.returncode: int | None = None
        try:
            os.setpgid(pid, pid)  # also here: whichever of the two runs first wins the race
        except OSError:
            pass  # the child did it already (or is gone)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped by the poll() this one interrupted (the signal
                # handler polls too): that call records the status.
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


class Supervisor:
    def __init__(
        self,
        run_child: Callable[[], int],
        processes: int,
        on_exit: Callable[[int], None] | None = None,
        *,
        restart_delay_base: float = RESTART_DELAY_BASE,
        restart_delay_cap: float = RESTART_DELAY_CAP,
        stable_seconds: float = STABLE_SECONDS,
    ) -> None:
        """``run_child()`` runs one worker in the child and returns its exit
        code; ``on_exit(pid)`` is told of each child reaped (the metrics drop
        its live gauges). The restart backoff: see the module docstring."""
        self.run_child = run_child
        self.on_exit = on_exit or (lambda pid: None)
        self.processes = processes
        self.children: dict[int, ForkedChild] = {}
        self.stopping = False
        self.exiting_now = False
        self.restarts = 0
        self.restart_delay_base = restart_delay_base
        self.restart_delay_cap = restart_delay_cap
        self.stable_seconds = stable_seconds
        # slot -> when its child was started, crashes in a row that came
        # sooner than stable_seconds after the start, and when its restart
        # is due (a slot waiting out its backoff has no live child).
        self._started_at: dict[int, float] = {}
        self._quick_crashes: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}

    def _spawn(self, slot: int) -> None:
        env = {"SHARDQ_WORKER_SLOT": str(slot), "SHARDQ_EXPECTED_WORKERS": str(self.processes)}
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            self.children[slot] = ForkedChild(self.run_child, env)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        self._started_at[slot] = time.monotonic()
        logger.info("started worker process %s (pid %s)", slot, self.children[slot].pid)

    def _forward(self, signum: int) -> None:
        """A stop request: pass it on to every child, once."""
        self.stopping = True
        logger.info("%s: stopping %s worker processes gracefully", signal_name(signum), len(self.children))
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def _exit_now(self, signum: int) -> None:
        """A second signal, or SIGQUIT: every child exits at once."""
        self.stopping = True
        self.exiting_now = True
        logger.warning("%s: worker processes exit now, without waiting for running jobs", signal_name(signum))
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGQUIT)

    def _crashed(self, slot: int, child: ForkedChild, code: int, now: float) -> None:
        """Schedule the restart of ``slot``'s crashed child after its backoff."""
        if now - self._started_at.get(slot, now) >= self.stable_seconds:
            self._quick_crashes[slot] = 0  # it stayed up a while: a fresh start
        crashes = self._quick_crashes[slot] = self._quick_crashes.get(slot, 0) + 1
        delay = restart_delay(crashes, self.restart_delay_base, self.restart_delay_cap)
        self._restart_at[slot] = now + delay
        why = " (replaced: threads stuck past their timeout)" if code == EXIT_RECYCLE else ""
        again = f", {crashes} in a row within {self.stable_seconds:g}s of their start" if crashes > 1 else ""
        logger.warning(
            "worker process %s (pid %s) exited with %s%s: restarting in %.1fs%s",
            slot,
            child.pid,
            code,
            why,
            delay,
            again,
        )

    def run(self) -> int:
        shutdown_signals.install().bind(self._forward, self._exit_now)
        for slot in range(self.processes):
            if self.stopping:
                break  # a signal came while the others were starting
            self._spawn(slot)
        reaped: set[int] = set()
        while True:
            alive = 0
            now = time.monotonic()
            for slot, child in list(self.children.items()):
                code = child.poll()
                if code is not None and child.pid not in reaped:
                    reaped.add(child.pid)
                    self.on_exit(child.pid)
                    if not self.stopping and code != 0:
                        self._crashed(slot, child, code, now)
                if code is None:
                    alive += 1
                elif slot in self._restart_at and not self.stopping:
                    # Waiting out its backoff: restarted when due. A stop
                    # signal meanwhile starts no new child.
                    if now >= self._restart_at[slot]:
                        del self._restart_at[slot]
                        self.restarts += 1
                        self._spawn(slot)
                    alive += 1
                # A child that stopped cleanly on its own is not replaced.
            if alive == 0:
                break
            time.sleep(POLL_SECONDS)
        codes = [child.returncode for child in self.children.values()]
        return 0 if all(code == 0 for code in codes) and not self.exiting_now else 1
