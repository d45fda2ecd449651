"""The fast tier starts no process: tests/conftest.py's guard fails an
unmarked test that starts one, and lets a ``process`` test start any."""

import subprocess

import pytest

from tests import conftest


def test_an_unmarked_test_that_starts_a_process_is_stopped_before_it_starts():
    with pytest.raises(conftest.ProcessOutsideTier, match=r"is not marked `process`"):
        subprocess.run(["true"], check=True)
    # The record the guard keeps fails this phase even when the error was
    # caught (as here): take it back, the refusal is what this test expects.
    assert len(conftest._started_outside_tier) == 1
    conftest._started_outside_tier.clear()


@pytest.mark.process
def test_a_process_test_may_start_a_process():
    assert subprocess.run(["true"], check=False).returncode == 0
