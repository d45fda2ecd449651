"""CPU time of the processes a bench compares, read from /proc.

``cluster_cpu``: the whole PostgreSQL server's CPU seconds so far (every
process of the cluster: backends, autovacuum, checkpointer, WAL writer), for
a server of the bench's own on this machine. ``children_cpu``: this
process's waited-for children's, so a worker's whole run (boot included)
once it exited.
"""

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cluster_cpu(postmaster: int | str) -> float:
    """CPU seconds of the cluster whose postmaster is ``postmaster``: its
    own and its reaped children's time plus each live child's, so a
    short-lived process (a backend, an autovacuum worker) that exits inside
    the window is still counted."""
    pid = str(postmaster)
    fields = _stat(pid)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = _stat(entry.name)
        except OSError:
            continue
        if child[1] == pid:
            total += int(child[11]) + int(child[12])
    return total / TICK


def children_cpu() -> float:
    """CPU seconds of this process's children that exited and were waited for."""
    times = os.times()
    return times.children_user + times.children_system
