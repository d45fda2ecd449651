"""Tasks that log (per-job logs, shardq/worker/joblogs.py)."""

import asyncio
import logging
import threading

from django.tasks import task

from shardq import exponential, shard_task

logger = logging.getLogger(__name__)

#: Set once ``async_leaves_a_logger``'s left-behind coroutine has logged.
LATE_LOGGED = threading.Event()


@shard_task(sensitive=("password",))
def chatty(lines: list[str], password: str) -> int:
    """Logs each of ``lines`` at INFO, one line with the password, a DEBUG
    line (below JOB_LOG_LEVEL) and a WARNING."""
    logger.debug("a debug line nobody keeps")
    for line in lines:
        logger.info("%s", line)
    logger.info("logging in with %s", password)
    logger.warning("a warning of the task")
    return len(lines)


@shard_task(max_attempts=3, backoff=exponential(base=1.0, cap=0.0, jitter=0.0))
def logs_then_fails(fail_times: int, size: int) -> int:
    """Logs ``size`` characters naming its attempt; fails its first ``fail_times`` attempts."""
    from .models import Ledger

    attempt = Ledger.objects.filter(worker="logs_then_fails").count() + 1
    Ledger.objects.create(job_id=0, attempt=attempt, worker="logs_then_fails")
    logger.info("attempt %d: %s", attempt, "x" * size)
    if attempt <= fail_times:
        raise RuntimeError(f"attempt {attempt} fails on purpose")
    return attempt


@shard_task(log=False)
def quiet(secret: str) -> None:
    """Logs, but keeps nothing (log=False)."""
    logger.info("this line is not kept: %s", secret)


@task()
def odd_records() -> None:
    """Records whose formatting raises, a NUL, lone surrogates, and lines
    from places that are not the task's: another thread, shardq's logger."""
    logger.info("%d apples", "not a number")  # formatting raises
    logger.info("nul \x00 inside")
    logger.info("surrogate \ud800 and \udfff here")
    logger.info("emoji 🚀 and é")
    logging.getLogger("shardq.worker.task_side").info("a shardq line")

    def other_thread() -> None:
        logger.info("from another thread")

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    logger.info("the task's last line")


@task()
def huge(size: int) -> None:
    """One message of ``size`` characters, then more lines."""
    logger.info("%s", "é" * size)
    logger.info("after the huge one")


@task()
async def async_logs(n: int) -> int:
    """An async task's lines, one from a coroutine it awaits in a child task."""
    logger.info("async line %d", n)

    async def child() -> None:
        logger.info("from a child task %d", n)

    await asyncio.create_task(child())
    return n


@task()
async def async_leaves_a_logger() -> None:
    """Returns while a coroutine it started logs later (after the attempt)."""

    async def later() -> None:
        await asyncio.sleep(0.05)
        logger.info("logged after the attempt ended")
        LATE_LOGGED.set()

    _LEFT.append(asyncio.get_running_loop().create_task(later()))
    logger.info("returning now")


_LEFT: list = []


@shard_task(max_attempts=2, backoff=exponential(base=1.0, cap=0.0, jitter=0.0), sensitive=("api_key",))
def sync_invoices(customer_id: int, api_key: str) -> int:
    """The admin's example (docs/admin.md, "A job's logs"): its first attempt
    logs, warns and fails; the second logs and returns."""
    from .models import Ledger

    attempt = Ledger.objects.filter(worker=f"sync_invoices:{customer_id}").count() + 1
    Ledger.objects.create(job_id=0, attempt=attempt, worker=f"sync_invoices:{customer_id}")
    logger.info("attempt %d: fetching invoices of customer %d with key %s", attempt, customer_id, api_key)
    if attempt == 1:
        logger.warning("billing API answered 503 <b>Service Unavailable</b>; giving up this attempt")
        raise ConnectionError("billing API unavailable")
    for n in range(1, 4):
        logger.info("invoice INV-%04d synced", n)
    logger.info("done: 3 invoices")
    return 3


@shard_task(timeout=0.5)
def logs_then_hangs() -> None:
    """Logs, then runs past its timeout (TaskTimeout ends it at its next bytecode)."""
    import time

    logger.info("before the deadline")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.02)
    logger.info("never reached: TaskTimeout is raised in the loop")
