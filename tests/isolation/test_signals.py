"""Signals and shutdown (issue 10, "Signals"; docs/reliability.md), with real
worker processes signalled the way a terminal (Ctrl-C), systemd or
``kill -TERM -- -PGID`` does: to the process group (``os.killpg``).

The rule: SIGTERM, SIGINT or SIGHUP stops gracefully (running jobs finish,
leases are released, exit 0); the same signal again within a second is the
same request; a later second signal, or SIGQUIT, exits now (non-zero, the
running jobs named in a WARNING); so does a grace period that runs out.
Default task settings throughout (max_attempts, on_worker_lost).
"""

import os
import re
import signal
import time

import pytest

import shardq
from tests.helpers import wait_until
from tests.taskapp import isolation_tasks as t
from tests.workers import alive, query, scalar

DEFAULT_LOGGING = {"DJANGO_SETTINGS_MODULE": "tests.isolation.default_logging_settings"}


def start_running(workers, processes: int, *, sleep: float, jobs: int = 4, grace: float = 30, env=None):
    """A worker (a supervisor when processes > 1) running ``jobs`` jobs of
    ``sleep`` seconds; returns (process, ids of the jobs RUNNING now)."""
    # One process: the worker itself (no --processes, no supervisor).
    supervised = ("--processes", str(processes)) if processes > 1 else ()
    proc = workers.start(*supervised, "--concurrency", "2", "--grace", str(grace), env=env)
    wait_until(
        lambda: scalar("SELECT count(*) FROM shardq_worker WHERE state <> 'STOPPED'") == processes,
        timeout=60,
        message=f"{processes} worker process(es) to register",
    )
    if processes > 1:
        wait_until(lambda: len(workers.children(proc)) == processes, timeout=30, message="the children")
    shardq.enqueue_many(t.started, [((), {"n": i, "sleep": sleep}) for i in range(jobs)])
    running = wait_until(
        lambda: running_ids() if len(running_ids()) >= min(jobs, 2) else None,
        timeout=60,
        message=lambda: f"jobs to start ({dict(query('SELECT status, count(*) FROM shardq_job GROUP BY 1'))})",
    )
    # Settled: no start write in flight (the log then names exactly the
    # started jobs). Short jobs (graceful tests) may already be finishing.
    last = [running]

    def settled():
        now = running_ids()
        same, last[0] = now == last[0], now
        return same and now

    if sleep > 10:
        running = wait_until(settled, timeout=30, interval=0.5, message="the running jobs to settle")
    return proc, running


def running_ids() -> set[int]:
    return {row[0] for row in query("SELECT id FROM shardq_job WHERE status = 'RUNNING'")}


def ids_named_lost(log: str) -> set[int]:
    """Job ids the worker's log says will end as WorkerLost."""
    ids = set()
    for line in log.splitlines():
        found = re.search(r"job\(s\) ([\d, ]+) will end as WorkerLost", line)
        if found:
            ids |= {int(n) for n in found.group(1).split(",")}
    return ids


def ids_named_being_started(log: str) -> set[int]:
    """Job ids the log says were being started at the signal (their start
    write in flight: WorkerLost too if it landed, else READY for free)."""
    ids = set()
    for line in log.splitlines():
        found = re.search(r"job\(s\) ([\d, ]+) were being started", line)
        if found:
            ids |= {int(n) for n in found.group(1).split(",")}
    return ids


def assert_stopped_gracefully(workers, proc, running: set[int]) -> None:
    """Exit 0; the jobs running at the signal finished once, with no worker
    loss; nothing claimed or running; every lease released; every worker
    incarnation STOPPED; no process left."""
    log = workers.log(proc)
    assert proc.returncode == 0, log
    rows = query("SELECT id, status, attempts, worker_losses FROM shardq_job WHERE id = ANY(%s)", [list(running)])
    assert sorted(rows) == sorted((job_id, "SUCCESSFUL", 1, 0) for job_id in running), (rows, log)
    assert scalar("SELECT count(*) FROM shardq_job WHERE status IN ('CLAIMED', 'RUNNING')") == 0
    # Jobs not started by then went back untouched.
    assert scalar("SELECT count(*) FROM shardq_job WHERE status = 'READY' AND attempts > 0") == 0
    assert scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 0, "a lease was left to expire"
    assert scalar("SELECT count(*) FROM shardq_worker WHERE state <> 'STOPPED'") == 0
    assert "exiting now" not in log and "WorkerLost" not in log, log
    assert workers.orphans() == []


@pytest.mark.parametrize(
    "processes,signum",
    [
        (2, signal.SIGTERM),  # systemd stop with KillMode=mixed, kill -TERM -- -PGID
        (2, signal.SIGINT),  # Ctrl-C in a terminal
        (2, signal.SIGHUP),  # the terminal closed
        (1, signal.SIGHUP),
    ],
    ids=["supervisor-SIGTERM", "supervisor-SIGINT", "supervisor-SIGHUP", "single-SIGHUP"],
)
def test_a_group_stop_signal_finishes_running_jobs_releases_leases_and_exits_0(workers, processes, signum):
    proc, running = start_running(workers, processes, sleep=1.5)
    # Group signals reach the supervisor only (each child leads a group of
    # its own): it passes them on, once. Were the children in its group, each
    # would get the signal twice and, unless the two happened to coalesce
    # into one delivery, take the second for "exit now".
    assert all(os.getpgid(pid) == pid for pid in workers.children(proc))
    os.killpg(proc.pid, signum)
    proc.wait(timeout=30)
    assert_stopped_gracefully(workers, proc, running)


def test_the_same_sigterm_to_every_process_at_once_is_one_stop_request(workers):
    """systemd's default KillMode=control-group sends SIGTERM to every process
    of the service; the supervisor forwards it too: each child gets it twice
    within a second, which is not a second signal."""
    proc, running = start_running(workers, 2, sleep=1.5)
    pids = workers.children(proc)
    os.killpg(proc.pid, signal.SIGTERM)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert_stopped_gracefully(workers, proc, running)


def test_a_second_group_signal_after_a_second_exits_now_naming_the_jobs_it_abandons(workers):
    proc, running = start_running(workers, 2, sleep=60)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(1.5)  # fault pacing: a second signal is one that comes more than a second later
    assert proc.poll() is None, f"the first signal must be graceful:\n{workers.log(proc)}"
    assert running <= running_ids(), "the running jobs go on after the first signal"
    began = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=20)
    log = workers.log(proc)
    assert code != 0 and time.monotonic() - began < 15, log
    assert "WARNING" in log and "exiting now" in log, log
    assert ids_named_lost(log) == running_ids() >= running, log
    wait_until(lambda: workers.orphans() == [], timeout=10, message="the children to exit")


@pytest.mark.parametrize("processes", [1, 2], ids=["single", "supervisor"])
def test_sigquit_always_exits_now_naming_the_jobs_it_abandons(workers, processes):
    proc, running = start_running(workers, processes, sleep=60)
    began = time.monotonic()
    os.killpg(proc.pid, signal.SIGQUIT)
    code = proc.wait(timeout=20)
    log = workers.log(proc)
    assert code != 0 and time.monotonic() - began < 15, log
    assert "exiting now" in log, log
    # Every job the table shows RUNNING is named: as lost, or (its start
    # write landing as the signal came) as being started, whose line says it
    # ends WorkerLost too if its start landed. Every job named lost is RUNNING.
    lost, being_started = ids_named_lost(log), ids_named_being_started(log)
    assert lost <= running_ids() <= lost | being_started, log
    assert running_ids() >= running, log
    wait_until(lambda: workers.orphans() == [], timeout=10, message="the children to exit")


@pytest.mark.parametrize("processes", [1, 2], ids=["single", "supervisor"])
def test_when_the_grace_runs_out_the_log_names_the_jobs_that_end_worker_lost_and_the_exit_is_non_zero(
    workers, processes
):
    """With Django's default LOGGING (nothing configured): the WARNING still
    reaches stderr."""
    proc, running = start_running(workers, processes, sleep=30, grace=1, env=DEFAULT_LOGGING)
    began = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=25)
    log = workers.log(proc)
    assert code != 0 and time.monotonic() - began < 20, log
    assert "grace period of 1s is over" in log, log
    assert ids_named_lost(log) == running_ids() >= running, log
    # The leases of the shards with abandoned jobs are left to expire; the
    # rest were released.
    held = scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL")
    assert 0 < held <= len(running_ids()), held
    assert scalar("SELECT count(*) FROM shardq_worker WHERE state <> 'STOPPED'") == 0
    wait_until(lambda: workers.orphans() == [], timeout=10, message="the children to exit")
    assert not alive(proc.pid)


@pytest.mark.parametrize("processes", [1, 2])
def test_sigusr1_prints_every_threads_stack_and_the_worker_carries_on(workers, processes):
    """An operator asks a worker that will not stop where it is: ``kill -USR1``
    prints each thread's stack (to stderr, under Django's default logging)
    and the worker keeps running; SIGTERM then still stops it cleanly."""
    proc, _running = start_running(workers, processes, sleep=0.5, jobs=2, env=DEFAULT_LOGGING)
    targets = [proc.pid, *(workers.children(proc) if processes > 1 else [])]
    for pid in targets:
        os.kill(pid, signal.SIGUSR1)
    wait_until(
        lambda: all(f"Stacks of process {pid} (SIGUSR1)" in workers.log(proc) for pid in targets),
        timeout=30,
        message=lambda: f"a stack dump from each of {targets}: {workers.log(proc)[-2000:]}",
    )
    assert "Thread 0x" in workers.log(proc) and '"shardq-leaser"' in workers.log(proc), workers.log(proc)[-2000:]
    for pid in targets:
        assert alive(pid), f"pid {pid} died on SIGUSR1: {workers.log(proc)[-2000:]}"
    assert "exited with" not in workers.log(proc), workers.log(proc)[-2000:]
    wait_until(lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") == 2, timeout=60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, workers.log(proc)[-3000:]
