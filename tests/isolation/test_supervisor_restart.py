"""A stop signal that lands while the supervisor waits out its restart delay
(at most one restart a second) must not start another worker process."""

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
