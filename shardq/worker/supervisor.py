"""``--processes N``: run N worker processes and restart any that crashes.

Each child is a plain ``shardq_worker --processes 1`` process (its own
incarnation id, leases and connections). SIGTERM/SIGINT are passed on to every
child; a second signal is passed on too (the children then exit at once).
A child that exits non-zero while the supervisor is not stopping is restarted,
at most once per second.
"""

import logging
import os
import signal
import subprocess
import sys
import time

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


class Supervisor:
    def __init__(self, child_args: list[str], processes: int):
        self.child_args = child_args
        self.processes = processes
        self.children: dict[int, subprocess.Popen] = {}
        self.stopping = False
        self.restarts = 0

    def _spawn(self, slot: int) -> None:
        # The supervisor ran the system checks already; children skip them.
        cmd = [sys.executable, "-m", "django", "shardq_worker", "--skip-checks", "--processes", "1", *self.child_args]
        env = dict(os.environ, SHARDQ_WORKER_SLOT=str(slot))
        env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", ""))
        self.children[slot] = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)
        logger.info("started worker process %s (pid %s)", slot, self.children[slot].pid)

    def _forward(self, signum, frame) -> None:
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
