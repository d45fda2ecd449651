"""An enqueuing process for the failover test: ``python -m tests.faults.enqueuer OUT``.

Enqueues ``tx_ledger`` jobs one at a time in autocommit (each enqueue is its
own committed transaction) until SIGTERM, and appends ``id wall_time`` to OUT
after each enqueue returned: exactly the jobs whose commit the caller saw.
A failed enqueue is written as ``error wall_time message``; the loop goes on
without any reconnect logic of its own (the backend drops a broken
connection, Django connects again on the next call).
"""

import os
import signal
import sys
import time


def main(path: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import DatabaseError

    from tests.taskapp import fault_tasks

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    n = 0
    with open(path, "a", buffering=1) as out:
        while not stop:
            try:
                result = fault_tasks.tx_ledger.enqueue(n=n, sleep=0.01)
            except DatabaseError as exc:
                out.write(f"error {time.time():.6f} {type(exc).__name__}: {str(exc).splitlines()[0][:80]}\n")
                time.sleep(0.02)  # pacing while the database is away
                continue
            out.write(f"{result.id} {time.time():.6f}\n")
            n += 1
            time.sleep(0.004)  # pacing: ~150 enqueues a second on the shared box


if __name__ == "__main__":
    main(sys.argv[1])
