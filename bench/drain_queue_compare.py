"""No-op drain rate of one in-process worker with the local sharded queue
(shardq.core.localqueue.LocalQueue) against a plain ``heapq`` + one lock
queue, alternated in one run (issue: "before and after wiring the local
queue"). Usage, with DATABASE_URL set and migrated for tests.settings:

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=tests.settings python bench/drain_queue_compare.py [jobs] [rounds]
"""

import heapq
import itertools
import statistics
import sys
import threading
import time

import django

django.setup()

from django.db import connection  # noqa: E402

import shardq  # noqa: E402
from shardq.worker import buffer as buffer_module  # noqa: E402
from shardq.worker.runtime import Worker, WorkerOptions  # noqa: E402
from tests.taskapp.tasks import noop  # noqa: E402


class PlainQueue:
    """The obvious structure: one heap, one lock, no lanes, no time index."""

    def __init__(self, lane_count, capacity):
        self.capacity = capacity
        self.lock = threading.Lock()
        self.heap, self.seq, self.jobs, self.running = [], itertools.count(), {}, {}

    @property
    def buffered(self):
        return len(self.jobs)

    @property
    def processing(self):
        return len(self.running)

    @property
    def free(self):
        return self.capacity - len(self.jobs) - len(self.running)

    def push(self, job, now):
        with self.lock:
            self.jobs[job.id] = job
            heapq.heappush(self.heap, (-job.priority, job.run_after, next(self.seq), job))

    def pop(self, now):
        with self.lock:
            while self.heap:
                job = heapq.heappop(self.heap)[3]
                if self.jobs.pop(job.id, None) is not None:
                    self.running[job.id] = job
                    return job
            return None

    def done(self, job_id):
        with self.lock:
            del self.running[job_id]

    def drop_shard(self, shard):
        with self.lock:
            dropped = [j for j in self.jobs.values() if j.shard == shard]
            for job in dropped:
                del self.jobs[job.id]
            return dropped

    def drain(self):
        with self.lock:
            jobs, self.jobs = list(self.jobs.values()), {}
            return jobs

    def next_due(self):
        return None


def drain_rate(n: int) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE shardq_job; DELETE FROM shardq_worker; UPDATE shardq_shard SET owner = NULL, lease_expires = NULL"
        )
    for start in range(0, n, 10000):
        shardq.enqueue_many(noop, [((), {})] * min(10000, n - start))
    worker = Worker(WorkerOptions(concurrency=4))
    thread = threading.Thread(target=worker.run)
    thread.start()
    while not worker.leaser.held:
        time.sleep(0.01)
    began = time.monotonic()
    while worker.stats["succeeded"] < n:
        time.sleep(0.01)
    rate = n / (time.monotonic() - began)
    worker.request_stop()
    thread.join()
    return rate


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    original = buffer_module.LocalQueue
    rates = {"LocalQueue (lanes, heapq index, time index)": [], "plain heapq + one lock": []}
    for _ in range(rounds):
        for name, cls in (
            ("LocalQueue (lanes, heapq index, time index)", original),
            ("plain heapq + one lock", PlainQueue),
        ):
            buffer_module.LocalQueue = cls
            rates[name].append(drain_rate(n))
    buffer_module.LocalQueue = original
    for name, values in rates.items():
        print(f"{name:45s} median {statistics.median(values):8.0f} jobs/s  runs {[round(v) for v in values]}")


if __name__ == "__main__":
    main()
