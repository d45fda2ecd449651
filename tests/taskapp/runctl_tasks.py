"""Tasks of the run-control tests (tests/acceptance/test_run_control.py):
timeouts, zombies, cooperative cancellation. Each writes what it saw to a
file the test names (``mark``), with the wall-clock time, so the test reads
what happened inside the worker without a database of its own."""

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path

from shardq import TaskTimeout, exponential, shard_task


def mark(path: str, **fields) -> None:
    """Append one JSON line to ``path``."""
    with Path(path).open("a") as f:
        f.write(json.dumps({"at": time.time(), **fields}) + "\n")


@shard_task(timeout=1)
def busy_loop(path: str) -> None:
    """Pure Python forever: only the TaskTimeout raised in its thread stops it."""
    mark(path, event="start")
    n = 0
    try:
        while True:
            n += 1
    finally:
        mark(path, event="stopped", iterations=n)


@shard_task(timeout=timedelta(seconds=1))
def stuck_in_c(path: str) -> None:
    """Stuck in C for an hour: no exception can reach it (a zombie)."""
    mark(path, event="start")
    time.sleep(3600)


@shard_task(timeout=1)
def swallows_timeout(path: str) -> str:
    """Catches the TaskTimeout and returns anyway: a late completion."""
    mark(path, event="start")
    try:
        while True:
            pass
    except TaskTimeout:
        mark(path, event="caught")
    return "late"


@shard_task(timeout=1, max_attempts=2, backoff=exponential(base=1.0, cap=0.1, jitter=0.0), takes_context=True)
def slow_then_fast(context, path: str) -> str:
    """The first attempt runs past its timeout; the retry returns at once."""
    mark(path, event="start", attempt=context.attempt, deadline=context.deadline.isoformat())
    if context.attempt == 1:
        while True:  # stopped by the worker: the retry comes from the outcome written at the deadline
            pass
    return "second"


@shard_task(timeout=1)
async def async_sleeper(path: str) -> None:
    mark(path, event="start")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        mark(path, event="cancelled")
        raise


@shard_task(takes_context=True)
def waits_for_cancel(context, path: str) -> str:
    """Polls is_cancelled() (a flag: no I/O) and says when it saw it."""
    mark(path, event="start")
    limit = time.monotonic() + 60
    while time.monotonic() < limit:
        if context.is_cancelled():
            mark(path, event="cancelled")
            return "stopped"
        time.sleep(0.001)
    mark(path, event="never told")
    return "never told"


@shard_task()
async def async_waits_for_cancel(path: str) -> None:
    mark(path, event="start")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        mark(path, event="cancelled")
        raise
    mark(path, event="never told")


@shard_task()
def quick(path: str, n: int) -> int:
    time.sleep(0.05)
    mark(path, event="ran", n=n)
    return n


@shard_task(timeout=1, takes_context=True)
def checks_its_deadline(context, path: str) -> None:
    """Stops itself with context.check_timeout() at a point of its choosing."""
    mark(path, event="start", deadline=context.deadline.timestamp(), time_left=context.time_left())
    while True:
        context.check_timeout()
        time.sleep(0.01)  # C: the worker's TaskTimeout could only land between sleeps
