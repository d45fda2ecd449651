"""``--processes N``: run N worker processes and restart any that crashes.

Each child is forked from the supervisor after Django is set up (no
re-import, no second round of system checks; database connections are closed
before the fork, so none is shared) and runs one ``Worker`` with its own
incarnation id, leases and connections. SIGTERM/SIGINT are passed on to every
child; a second signal is passed on too (the children then exit at once).
A child that exits non-zero while the supervisor is not stopping is restarted,
at most once per second.
"""

import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable

logger = logging.getLogger("shardq.worker.supervisor")

PR_SET_PDEATHSIG = 1


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
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
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

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


class Supervisor:
    def __init__(self, run_child: Callable[[], int], processes: int) -> None:
        """``run_child()`` runs one worker in the child and returns its exit code."""
        self.run_child = run_child
        self.processes = processes
        self.children: dict[int, ForkedChild] = {}
        self.stopping = False
        self.restarts = 0

    def _spawn(self, slot: int) -> None:
        env = {"SHARDQ_WORKER_SLOT": str(slot), "SHARDQ_EXPECTED_WORKERS": str(self.processes)}
        self.children[slot] = ForkedChild(self.run_child, env)
        logger.info("started worker process %s (pid %s)", slot, self.children[slot].pid)

    def _forward(self, signum: int, frame: object) -> None:
        self.stopping = True
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        for slot in range(self.processes):
            self._spawn(slot)
        last_restart = 0.0
        while True:
            alive = 0
            for slot, child in list(self.children.items()):
                code = child.poll()
                if code is None:
                    alive += 1
                elif not self.stopping and code != 0:
                    wait = last_restart + 1.0 - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    logger.warning("worker process %s (pid %s) exited with %s: restarting", slot, child.pid, code)
                    self.restarts += 1
                    last_restart = time.monotonic()
                    self._spawn(slot)
                    alive += 1
                elif not self.stopping:
                    # A child that stopped cleanly on its own is not replaced.
                    pass
            if alive == 0:
                break
            time.sleep(0.2)
        codes = [child.returncode for child in self.children.values()]
        return 0 if all(code == 0 for code in codes) else 1
