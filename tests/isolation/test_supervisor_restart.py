"""A stop signal that lands while the supervisor waits out its restart delay
(at most one restart a second) must not start another worker process."""

import itertools
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from shardq.worker.supervisor import Supervisor

    RUNS = sys.argv[1]
    supervisor_pid = os.getpid()

    def run_child():
        with open(RUNS, "a") as f:
            f.write("run\\n")
        with open(RUNS) as f:
            runs = len(f.readlines())
        if runs == 2:
            # The second crash: the supervisor now waits about a second before
            # restarting; a SIGTERM from outside lands in that wait.
            if os.fork() == 0:
                time.sleep(0.4)
                os.kill(supervisor_pid, signal.SIGTERM)
                os._exit(0)
        return 1  # crash at once

    supervisor = Supervisor(run_child, processes=1)
    code = supervisor.run()
    print(supervisor.restarts, code)
    """
)


@pytest.mark.process
def test_sigterm_during_the_restart_delay_starts_no_new_worker(tmp_path):
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(runs)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    restarts, code = done.stdout.split()
    # The first crash is restarted at once, the second waits; the SIGTERM in
    # that wait stops the supervisor: two runs in all, one restart, exit 1
    # (its children crashed).
    assert runs.read_text().count("run") == 2, done.stderr
    assert (restarts, code) == ("1", "1"), done.stderr


BACKOFF_SCRIPT = textwrap.dedent(
    """
    import logging, os, signal, sys, time
    from shardq.worker.supervisor import Supervisor

    RUNS, STAY_UP, LAST = sys.argv[1], [float(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    supervisor_pid = os.getpid()

    def run_child():
        with open(RUNS, "a") as f:
            f.write(f"{time.monotonic()}\\n")
        with open(RUNS) as f:
            runs = len(f.readlines())
        if runs == LAST:
            os.kill(supervisor_pid, signal.SIGTERM)  # enough runs seen: stop
            return 0
        time.sleep(STAY_UP[runs - 1] if runs <= len(STAY_UP) else 0)
        return 1  # a crash

    kwargs = dict(arg.split("=") for arg in sys.argv[4:])
    supervisor = Supervisor(run_child, processes=1, **{k: float(v) for k, v in kwargs.items()})
    print(supervisor.run(), supervisor.restarts)
    """
)


def supervise(tmp_path, stay_up: str, last: int, *options: str):
    """Run a supervisor whose child crashes after ``stay_up`` seconds (one
    figure per run, comma-separated; 0: dies at once) until its run number
    ``last`` stops the supervisor. Returns (the gaps between the runs'
    starts, in seconds, and the log)."""
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-c", BACKOFF_SCRIPT, str(runs), stay_up, str(last), *options],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    starts = [float(line) for line in runs.read_text().split()]
    assert len(starts) == last, done.stderr
    return [b - a for a, b in itertools.pairwise(starts)], done.stderr


@pytest.mark.process
def test_a_worker_process_that_dies_at_once_is_restarted_ever_more_slowly(tmp_path):
    """With the defaults: the first restart at once, then after 1 s, 2 s,
    4 s... (the restart loop of issue 24 ran 45 times in 75 s: once a
    second). Five runs take 0 + 1 + 2 + 4 s of waiting."""
    gaps, log = supervise(tmp_path, "0", 5)
    for gap, delay in zip(gaps, [0.0, 1.0, 2.0, 4.0], strict=True):
        # A crash is seen at the next look (every 0.2 s); slack for a busy machine.
        assert delay <= gap <= delay + 1.0, (gaps, log)
    # Each restart is logged with its delay.
    for delay in ("0.0", "1.0", "2.0", "4.0"):
        assert f"exited with 1: restarting in {delay}s" in log, log
    assert "4 in a row within 60s of their start" in log, log


@pytest.mark.process
def test_the_restart_delay_doubles_up_to_its_cap_and_the_rate_stays_bounded(tmp_path):
    """A child that always dies at once, with a 0.1 s base and a 0.4 s cap:
    the delays are 0, 0.1, 0.2, 0.4, 0.4, 0.4, ... so nine runs take at
    least 2.3 s; a restart a poll (0.2 s) would take 1.6 s."""
    gaps, log = supervise(tmp_path, "0", 9, "restart_delay_base=0.1", "restart_delay_cap=0.4")
    expected = [0.0, 0.1, 0.2, 0.4, 0.4, 0.4, 0.4, 0.4]
    for gap, delay in zip(gaps, expected, strict=True):
        assert delay <= gap <= delay + 1.0, (gaps, log)
    assert sum(gaps) >= sum(expected), (gaps, log)
    assert log.count("restarting in 0.4s") == 5, log


@pytest.mark.process
def test_a_process_that_stayed_up_a_while_is_restarted_at_once_again(tmp_path):
    """The backoff resets after a run of ``stable_seconds``: the third run
    stays up 1.5 s (stable: 1 s) and its crash is restarted at once, not
    after the 2 s its predecessors' crashes had reached."""
    gaps, log = supervise(tmp_path, "0,0,1.5,0", 5, "stable_seconds=1")
    # run 1 dies: at once; run 2 dies: 1 s; run 3 stays up 1.5 s: at once; run 4 dies: 1 s.
    assert 0.0 <= gaps[0] <= 1.0, (gaps, log)
    assert 1.0 <= gaps[1] <= 2.0, (gaps, log)
    assert 1.5 <= gaps[2] <= 2.5, (gaps, log)
    assert 1.0 <= gaps[3] <= 2.0, (gaps, log)
    assert log.count("restarting in 0.0s") == 2, log
