"""Prometheus metrics (``shardq[metrics]``, ``prometheus-client``): the
definitions, the label guard and the HTTP endpoint. ``docs/operations.md``
lists every metric.

Off unless asked for: ``shardq_worker --metrics-port N`` or
``SHARDQ["METRICS_PORT"]``. Nothing here imports ``prometheus_client``
until ``enable()`` runs, so a project without the extra pays nothing, and the
hot paths test one attribute (``metrics is not None``) when metrics are off.

Where each family is counted:

- ``shardq_jobs_enqueued_total`` and ``shardq_jobs_finished_total{outcome=
  "cancelled"}`` in the process that enqueues or cancels (a web process, a
  task, the scheduler): a ``task_enqueued`` receiver and ``shardq.cancel``.
  Such a process exposes them through its own endpoint
  (``shardq.metrics.metrics_view``, or any exporter that serves
  prometheus_client's default registry);
- everything else in the worker process that did the work.

Labels are ``queue``, ``task``, ``outcome`` (and ``state`` for the cluster
gauge of jobs): never an id, a key or an argument, except ``fair_key`` on the
fair key gauges (each queue's top ``shardq.fairness.TOP_KEYS`` and "other",
at most ``MAX_FAIR_KEY_LABELS`` names a process). Their values are bounded
(``LabelGuard``): a queue is named only if ``TASKS`` configures it, a task
only if it is a defined task, and past ``MAX_LABEL_VALUES`` distinct names
in a process the rest are counted under ``"other"``.
"""

import os
import shutil
import tempfile
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .jobs import ClaimedJob, Outcome

#: The process's metrics once ``enable()`` ran, else None (metrics off).
active: "Metrics | None" = None
_enable_lock = threading.Lock()

#: Distinct queue (or task) label values a process uses before it counts the
#: rest under OTHER. A queue is a configured one and a task a defined one, so
#: this only bites when TASKS allows any queue name (an empty QUEUES list).
MAX_LABEL_VALUES = 200
OTHER = "other"
#: Distinct fair keys a process names in the fair key gauges (each round
#: shows each queue's top few; as they change, past this many the new ones
#: count under OTHER).
MAX_FAIR_KEY_LABELS = 100
#: Raw (queue, task) pairs remembered with their children; past this a pair
#: is looked up each time (an attacker's stream of names costs no memory).
MAX_CACHED_PAIRS = 10_000

# Outcomes (the ``outcome`` label of shardq_jobs_finished_total).
SUCCEEDED = "succeeded"
RETRIED = "retried"
FAILED = "failed"  # a task allowing one attempt failed (max_attempts = 1)
DEAD = "dead"  # a task with retries used them all (max_attempts >= 2): FAILED
CANCELLED = "cancelled"  # shardq.cancel(), counted by the cancelling process
TIMED_OUT = "timed_out"  # FAILED at the attempt's deadline (a timeout that is retried counts as retried)
OUTCOMES = (SUCCEEDED, RETRIED, FAILED, DEAD, CANCELLED, TIMED_OUT)

# Histogram buckets, seconds unless named.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)

# Cluster gauge job states: the unfinished ones, each counted through its
# partial index (finished jobs are counted as they finish, by the counters).
CLUSTER_STATES = ("READY", "CLAIMED", "RUNNING", "WAITING", "SUSPENDED")

ENQUEUED_RECEIVER = "shardq_metrics_enqueued"


def import_client() -> Any:
    """``prometheus_client``, or ImproperlyConfigured saying how to install it."""
    try:
        import prometheus_client
    except ImportError:
        raise ImproperlyConfigured(
            "shardq's metrics need prometheus-client: pip install 'shardq[metrics]' "
            "(or prometheus-client), or leave --metrics-port and SHARDQ['METRICS_PORT'] unset."
        )
    return prometheus_client


def configured_queues() -> frozenset[str] | None:
    """Every queue a shardq backend in TASKS allows, or None when one allows any name."""
    from django.tasks.base import DEFAULT_TASK_QUEUE_NAME

    names: set[str] = set()
    for config in (getattr(settings, "TASKS", {}) or {}).values():
        if not isinstance(config, dict) or "shardq" not in str(config.get("BACKEND", "")):
            continue
        queues = config.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
        if not queues:
            return None
        names.update(queues)
    return frozenset(names)


class LabelGuard:
    """Label values with bounded cardinality: a queue TASKS configures, a
    task the process defines, at most ``limit`` distinct of each; anything
    else is ``"other"``."""

    def __init__(self, queues: frozenset[str] | None, limit: int = MAX_LABEL_VALUES) -> None:
        self.queues = queues
        self.limit = limit
        self._queue_names: set[str] = set()
        self._task_names: set[str] = set()
        self._lock = threading.Lock()

    def queue(self, name: str) -> str:
        if self.queues is not None:
            return name if name in self.queues else OTHER
        return self._bounded(self._queue_names, name)

    def task(self, path: str) -> str:
        from ..tasks import registered_task_paths

        if path not in self._task_names and path not in registered_task_paths():
            return OTHER
        return self._bounded(self._task_names, path)

    def _bounded(self, seen: set[str], name: str) -> str:
        with self._lock:
            if name in seen:
                return name
            if len(seen) < self.limit:
                seen.add(name)
                return name
        return OTHER


def observe_many(histogram: Any, amounts: list[float]) -> None:
    """``histogram.observe(a)`` for each amount, as one inc() per bucket used
    (prometheus_client's Histogram child: ``_upper_bounds``, ``_buckets``, ``_sum``)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:  # another prometheus_client: the public way
        for amount in amounts:
            histogram.observe(amount)
        return
    counts: dict[int, int] = {}
    for amount in amounts:
        # observe() counts an amount in the first bucket whose bound is >= it.
        i = bisect_left(bounds, amount)
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(amounts))
    for i, n in counts.items():
        buckets[i].inc(n)


class _Children:
    """The labelled children of one (queue, task) pair, looked up once."""

    __slots__ = ("queue", "task", "enqueued", "started", "duration", "wait", "finished", "fence_rejections")

    def __init__(self, metrics: "Metrics", queue: str, task: str) -> None:
        self.queue = queue
        self.task = task
        self.enqueued = metrics.enqueued.labels(queue, task)
        self.started = metrics.started.labels(queue, task)
        self.duration = metrics.duration.labels(queue, task)
        self.wait = metrics.wait.labels(queue, task)
        self.finished = {outcome: metrics.finished.labels(queue, task, outcome) for outcome in OUTCOMES}
        self.fence_rejections = metrics.fence_rejections.labels(queue, task)


class Metrics:
    """Every shardq metric of this process (one instance: ``enable()``)."""

    def __init__(self, registry: Any, multiprocess: bool) -> None:
        client = import_client()
        self.multiprocess = multiprocess
        # Counts enqueues and cancels (counts_enqueues(), set by enable()).
        self.enqueue_side = True
        self.guard = LabelGuard(configured_queues())
        self._children: dict[tuple[str, str], _Children] = {}
        self._children_lock = threading.Lock()
        pair = ("queue", "task")
        Counter, Gauge, Histogram = client.Counter, client.Gauge, client.Histogram
        self.enqueued = Counter("shardq_jobs_enqueued", "Jobs enqueued by this process.", pair, registry=registry)
        self.started = Counter("shardq_jobs_started", "Attempts started by this worker.", pair, registry=registry)
        self.finished = Counter(
            "shardq_jobs_finished",
            "Attempts finished, by outcome (written: a refused write is a fence rejection instead); "
            "cancelled: counted by the process that cancelled.",
            (*pair, "outcome"),
            registry=registry,
        )
        self.fence_rejections = Counter(
            "shardq_fence_rejections",
            "Outcomes refused by their fence: the job changed hands or was cancelled while running.",
            pair,
            registry=registry,
        )
        self.duration = Histogram(
            "shardq_job_duration_seconds", "Task run time.", pair, buckets=DURATION_BUCKETS, registry=registry
        )
        self.wait = Histogram(
            "shardq_job_wait_seconds",
            "Attempt start minus the later of enqueue and run_after (database clock).",
            pair,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.claim_duration = Histogram(
            "shardq_claim_duration_seconds", "claim_jobs round trips.", buckets=CLAIM_BUCKETS, registry=registry
        )
        self.claim_batch = Histogram(
            "shardq_claim_batch_size", "Jobs returned by one claim.", buckets=BATCH_BUCKETS, registry=registry
        )
        # Per process; with --processes the group's sum (livesum: a dead
        # child's value goes with it).
        self.shards_owned = Gauge(
            "shardq_worker_shards_owned", "Shards this worker leases.", registry=registry, multiprocess_mode="livesum"
        )
        self.slots_busy = Gauge(
            "shardq_worker_slots_busy", "Jobs running or being started.", registry=registry, multiprocess_mode="livesum"
        )
        self.slots = Gauge(
            "shardq_worker_slots", "Threads for sync tasks.", registry=registry, multiprocess_mode="livesum"
        )
        # Cluster gauges: set by the one worker holding the metrics lock,
        # zero elsewhere (livemax: the holder's value wins in a group).
        self.cluster_holder = Gauge(
            "shardq_cluster_metrics_holder",
            "1 on the worker that computes the cluster gauges.",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.jobs = Gauge(
            "shardq_jobs",
            "Unfinished jobs by queue and state (cluster gauge).",
            ("queue", "state"),
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.oldest_ready = Gauge(
            "shardq_oldest_ready_age_seconds",
            "Age of the oldest due READY job by queue, since it fell due (cluster gauge).",
            ("queue",),
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.shards_unowned = Gauge(
            "shardq_shards_unowned",
            "Shards unowned or expired in pools with a live worker (cluster gauge).",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self._cluster_labels: set[tuple[str, ...]] = set()
        # Live queue controls (shardq/queues.py): cluster gauges too.
        self.queue_paused = Gauge(
            "shardq_queue_paused",
            "1 for a queue an operator paused (manage.py shardq_queue, the admin's Queues page) (cluster gauge).",
            ("queue",),
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.queue_concurrency = Gauge(
            "shardq_queue_concurrency_override",
            "A queue's concurrency override: its jobs each worker holds at once, at most (cluster gauge; 0: none).",
            ("queue",),
            registry=registry,
            multiprocess_mode="livemax",
        )
        self._control_labels: set[str] = set()
        # Each queue's top fair keys (docs/fairness.md): cluster gauges too,
        # labelled by queue and fair_key, the key one of the report's top
        # (shardq.fairness.TOP_KEYS) or "other", and at most
        # MAX_FAIR_KEY_LABELS distinct keys a process (past them, "other").
        fair = ("queue", "fair_key")
        self.fair_backlog = Gauge(
            "shardq_fair_key_backlog",
            "Jobs waiting (READY or CLAIMED) of a queue's top fair keys, the rest as other (cluster gauge).",
            fair,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.fair_oldest = Gauge(
            "shardq_fair_key_oldest_wait_seconds",
            "How long the oldest due waiting job of a top fair key has waited (cluster gauge).",
            fair,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.fair_starts = Gauge(
            "shardq_fair_key_starts_share",
            "A top fair key's share (0-1) of its queue's fair starts over the last minute (cluster gauge).",
            fair,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.fair_time = Gauge(
            "shardq_fair_key_time_share",
            "A top fair key's share (0-1) of its queue's fair worker time over the last minute (cluster gauge).",
            fair,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.history_rows = Gauge(
            "shardq_history_rows_estimated",
            "Finished jobs in shardq_job_history, by the planner's estimate (no count(*)) (cluster gauge).",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.history_partitions = Gauge(
            "shardq_history_partitions",
            "Partitions of shardq_job_history (one per HISTORY_PARTITION_SECONDS span kept) (cluster gauge).",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.history_oldest = Gauge(
            "shardq_history_oldest_seconds",
            "Age of the start of the oldest history partition: how far back history reaches (cluster gauge).",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self._fair_names: set[str] = set()
        self._fair_labels: set[tuple[str, str]] = set()
        # Per-job events wait here until ``flush()`` (the gauges thread, once
        # a second): an executor thread appends one tuple to a deque (atomic,
        # no lock) and touches no prometheus_client object, whose every
        # inc() takes a lock (and in multiprocess mode writes a file).
        self._started: deque[tuple[str, str, Any, float, Any]] = deque()
        self._ran: deque[tuple[str, str, float]] = deque()

    # -- labels -------------------------------------------------------------------

    def children(self, queue_name: str, task_path: str) -> _Children:
        key = (queue_name, task_path)
        found = self._children.get(key)
        if found is None:
            queue, task = self.guard.queue(queue_name), self.guard.task(task_path)
            with self._children_lock:
                found = self._children.get((queue, task))
                if found is None:
                    found = self._children[(queue, task)] = _Children(self, queue, task)
                if len(self._children) < MAX_CACHED_PAIRS:
                    self._children[key] = found
        return found

    # -- events (one call each; see the callers) ----------------------------------

    def count_enqueued(self, sender: object = None, task_result: Any = None, **kwargs: object) -> None:
        """A ``task_enqueued`` receiver."""
        task = task_result.task
        self.children(task.queue_name, task.module_path).enqueued.inc()

    def count_cancelled(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.children(row["queue_name"], row["task_path"]).finished[CANCELLED].inc()

    def job_started(self, job: "ClaimedJob") -> None:
        """An attempt begins: counted, with how long it waited since due (at the next flush)."""
        self._started.append((job.queue_name, job.task_path, job.enqueued_at, job.run_after, job.last_attempted_at))

    def job_ran(self, job: "ClaimedJob", seconds: float) -> None:
        """An attempt's task returned or raised after ``seconds`` (at the next flush)."""
        self._ran.append((job.queue_name, job.task_path, seconds))

    def flush(self) -> None:
        """Add the queued per-job events to their metrics, aggregated: one
        inc() per child and bucket, not per job."""
        started: dict[_Children, list[float]] = {}
        events = self._started
        while events:
            queue_name, task_path, enqueued_at, run_after, attempted_at = events.popleft()
            due = max(enqueued_at.timestamp(), run_after)
            waits = started.setdefault(self.children(queue_name, task_path), [])
            waits.append(max(0.0, attempted_at.timestamp() - due))
        for children, waits in started.items():
            children.started.inc(len(waits))
            observe_many(children.wait, waits)
        ran: dict[_Children, list[float]] = {}
        durations = self._ran
        while durations:
            queue_name, task_path, seconds = durations.popleft()
            ran.setdefault(self.children(queue_name, task_path), []).append(seconds)
        for children, seconds_list in ran.items():
            observe_many(children.duration, seconds_list)

    def fence_rejected(self, job: "ClaimedJob") -> None:
        self.children(job.queue_name, job.task_path).fence_rejections.inc()

    def committed_by_task(self, job: "ClaimedJob") -> None:
        """A task wrote its own SUCCESSFUL outcome (shardq.complete_in_transaction)."""
        self.children(job.queue_name, job.task_path).finished[SUCCEEDED].inc()

    def outcomes_written(self, outcomes: Iterable["Outcome"], applied: set[tuple[int, int]]) -> None:
        """One completer batch: each outcome written, or refused by its fence.
        Counted per (children, outcome) once a batch."""
        counts: dict[Any, int] = {}
        for outcome in outcomes:
            job = outcome.job
            if job is None:
                continue
            children = self.children(job.queue_name, job.task_path)
            if (outcome.id, outcome.rank) in applied:
                if outcome.status == "SUCCESSFUL":
                    child = children.finished[SUCCEEDED]
                elif outcome.status == "READY":
                    child = children.finished[RETRIED]
                elif outcome.extra.get("timed_out"):
                    child = children.finished[TIMED_OUT]
                else:
                    child = children.finished[DEAD if job.max_attempts > 1 else FAILED]
            else:
                child = children.fence_rejections
            counts[child] = counts.get(child, 0) + 1
        for child, n in counts.items():
            child.inc(n)

    def claimed(self, seconds: float, jobs: int) -> None:
        self.claim_duration.observe(seconds)
        self.claim_batch.observe(jobs)

    # -- gauges ---------------------------------------------------------------------

    def worker_sample(self, *, shards_owned: int, busy: int, slots: int) -> None:
        self.shards_owned.set(shards_owned)
        self.slots_busy.set(busy)
        self.slots.set(slots)

    def cluster_sample(self, rows: Iterable[Mapping[str, Any]] | None, unowned: int = 0) -> None:
        """The cluster gauges from ``cluster_metrics`` rows, or all zero
        (None: this worker does not hold the metrics lock). A label set
        this process set before and not now goes to zero (never removed:
        in multiprocess mode a removed child's value stays in its file)."""
        seen: set[tuple[str, ...]] = set()
        if rows is not None:
            ready: dict[str, float] = {}
            counts: dict[tuple[str, str], float] = {}
            for row in rows:
                queue = self.guard.queue(row["queue_name"])
                key = (queue, row["status"])
                counts[key] = counts.get(key, 0) + row["jobs"]
                if row["oldest_due_seconds"] is not None:
                    ready[queue] = max(ready.get(queue, 0.0), row["oldest_due_seconds"])
            for (queue, state), n in counts.items():
                self.jobs.labels(queue, state).set(n)
                seen.add(("jobs", queue, state))
            for queue in {queue for queue, _ in counts}:
                self.oldest_ready.labels(queue).set(ready.get(queue, 0.0))
                seen.add(("oldest", queue))
        for label in self._cluster_labels - seen:
            if label[0] == "jobs":
                self.jobs.labels(*label[1:]).set(0)
            else:
                self.oldest_ready.labels(*label[1:]).set(0)
        self._cluster_labels |= seen
        self.shards_unowned.set(unowned if rows is not None else 0)
        self.cluster_holder.set(1 if rows is not None else 0)

    def queue_control_sample(self, rows: Iterable[Any] | None) -> None:
        """The queue control gauges from ``queue_controls`` rows (queue_name,
        paused, concurrency), or all zero (None: not the metrics lock's
        holder); a queue no longer controlled goes to zero."""
        values: dict[str, tuple[float, float]] = {}
        for queue_name, paused, concurrency in rows or ():
            values[self.guard.queue(queue_name)] = (1.0 if paused else 0.0, float(concurrency or 0))
        for queue in self._control_labels - values.keys():
            values[queue] = (0.0, 0.0)
        for queue, (paused, concurrency) in values.items():
            self.queue_paused.labels(queue).set(paused)
            self.queue_concurrency.labels(queue).set(concurrency)
        self._control_labels |= values.keys()

    def history_sample(self, row: Sequence[Any] | None) -> None:
        """The history gauges from a ``history_gauges`` row (estimated rows,
        partitions, seconds since the oldest partition's start), or all zero
        (None: not the metrics lock's holder, or no history table)."""
        rows, partitions, age = row if row else (0, 0, None)
        self.history_rows.set(max(int(rows or 0), 0))
        self.history_partitions.set(int(partitions or 0))
        self.history_oldest.set(max(float(age or 0.0), 0.0))

    def fair_sample(self, report: Iterable[Mapping[str, Any]] | None) -> None:
        """The fair key gauges from ``shardq.fairness.summarize_fair_keys``'s
        report, or all zero (None: not the metrics lock's holder). A key
        past MAX_FAIR_KEY_LABELS distinct names is added to "other"; a label
        set not in this report goes to zero (never removed, as cluster_sample)."""
        values: dict[tuple[str, str], list[float]] = {}
        for entry in report or ():
            queue = self.guard.queue(entry["queue"])
            for key in entry["keys"]:
                name = key["key"]
                if name != OTHER and name not in self._fair_names:
                    if len(self._fair_names) < MAX_FAIR_KEY_LABELS:
                        self._fair_names.add(name)
                    else:
                        name = OTHER
                old = values.get((queue, name))
                oldest = key["oldest_seconds"] or 0.0
                if old is None:
                    values[(queue, name)] = [key["backlog"], oldest, key["starts_share"], key["time_share"]]
                else:
                    old[0] += key["backlog"]
                    old[1] = max(old[1], oldest)
                    old[2] += key["starts_share"]
                    old[3] += key["time_share"]
        for labels in self._fair_labels - values.keys():
            values[labels] = [0.0, 0.0, 0.0, 0.0]
        for labels, (backlog, oldest, starts, time_share) in values.items():
            self.fair_backlog.labels(*labels).set(backlog)
            self.fair_oldest.labels(*labels).set(oldest)
            self.fair_starts.labels(*labels).set(starts)
            self.fair_time.labels(*labels).set(time_share)
        self._fair_labels |= values.keys()


def enable(*, multiprocess: bool = False, registry: Any = None) -> Metrics:
    """Turn this process's metrics on (once; later calls return the same).
    In a worker child of ``--processes`` (``multiprocess``), values go to
    PROMETHEUS_MULTIPROC_DIR for the supervisor's endpoint; otherwise to
    ``registry`` (default: prometheus_client's default registry).
    Enqueues and cancels are counted unless ``SHARDQ["ENQUEUE_METRICS"]``
    is False.
    Refuses (ImproperlyConfigured) a PROMETHEUS_MULTIPROC_DIR this process
    would not write to (``check_multiprocess_dir``)."""
    global active
    with _enable_lock:
        if active is None or active.multiprocess != multiprocess:
            client = import_client()
            from django.tasks.signals import task_enqueued

            if not multiprocess:
                check_multiprocess_dir()
            # A forked child inherits the supervisor's metrics (apps.ready()
            # enabled them from METRICS_PORT): they count in memory, so the
            # child builds its own, which write to the directory.
            task_enqueued.disconnect(dispatch_uid=ENQUEUED_RECEIVER)
            active = Metrics(None if multiprocess else registry or client.REGISTRY, multiprocess)
            active.enqueue_side = enqueue_switch() is not False
            if active.enqueue_side:
                task_enqueued.connect(active.count_enqueued, dispatch_uid=ENQUEUED_RECEIVER)
        return active


def enqueue_switch() -> bool | None:
    """``SHARDQ["ENQUEUE_METRICS"]``: True (count this process's enqueues
    and cancels, even with no METRICS_PORT: a web process), False (never),
    None (the default: wherever metrics are on)."""
    switch = (getattr(settings, "SHARDQ", {}) or {}).get("ENQUEUE_METRICS")
    if switch is not None and not isinstance(switch, bool):
        raise ImproperlyConfigured(
            f"SHARDQ['ENQUEUE_METRICS'] must be True, False or None (wherever metrics are on), not {switch!r}."
        )
    return switch


def counts_enqueues() -> bool:
    """Does ``apps.ready()`` turn this process's enqueue-side counting on?
    ``ENQUEUE_METRICS`` when True or False; None: where METRICS_PORT is set."""
    switch = enqueue_switch()
    if switch is None:
        return (getattr(settings, "SHARDQ", {}) or {}).get("METRICS_PORT") is not None
    return switch


def check_multiprocess_dir() -> None:
    """With PROMETHEUS_MULTIPROC_DIR set (gunicorn's workers, say), every
    process must write its values to that directory, which the metrics view
    merges: ImproperlyConfigured when it is not a directory, or when
    prometheus_client was imported before the variable was set (its values
    would stay in this process's memory and the view would miss them)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return
    if not os.path.isdir(path):
        raise ImproperlyConfigured(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory: create it (empty) before the server "
            'starts, or unset the variable for a single process (docs/operations.md, "Metrics").'
        )
    from prometheus_client import values

    if values.ValueClass.__name__ != "MmapedValue":
        raise ImproperlyConfigured(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} is set, but prometheus_client was imported before it was, so "
            "this process would count its enqueues in its own memory and the merged metrics would miss them. "
            "Set the variable in the environment the server starts with (e.g. "
            "`PROMETHEUS_MULTIPROC_DIR=/run/shardq-metrics gunicorn ...`), not in settings or code "
            '(docs/operations.md, "Metrics").'
        )


def disable() -> None:
    """Metrics off in this process again (the metric objects stay registered:
    enable again with another ``registry``)."""
    global active
    with _enable_lock:
        from django.tasks.signals import task_enqueued

        task_enqueued.disconnect(dispatch_uid=ENQUEUED_RECEIVER)
        active = None


def enable_if_configured() -> None:
    """``apps.ready()``: a process that counts its enqueues and cancels
    (``counts_enqueues()``: ``SHARDQ["ENQUEUE_METRICS"]``, or where
    ``METRICS_PORT`` is set) turns its metrics on; a worker serves them on
    its port, a web process through ``metrics_view`` or its own exporter."""
    if not counts_enqueues():
        return
    try:
        import_client()
    except ImproperlyConfigured:
        if (getattr(settings, "SHARDQ", {}) or {}).get("ENQUEUE_METRICS"):
            raise  # asked for by name: say what is missing
        return  # the worker refuses to start with the reason; a web process goes on
    enable()


def metrics_view(request: Any) -> Any:
    """A Django view serving this process's metrics (Prometheus text): for a
    web process, whose enqueues are counted here. With several processes
    (gunicorn workers) set PROMETHEUS_MULTIPROC_DIR as prometheus_client
    documents; this view then serves the merged values."""
    from django.http import HttpResponse

    client = import_client()
    registry = client.REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess as client_multiprocess

        check_multiprocess_dir()  # else the merged values would miss this process's

        registry = client.CollectorRegistry()
        client_multiprocess.MultiProcessCollector(registry)
    return HttpResponse(client.generate_latest(registry), content_type=client.CONTENT_TYPE_LATEST)


# -- the endpoint and --processes ----------------------------------------------------


class MultiprocessDirectory:
    """A fresh PROMETHEUS_MULTIPROC_DIR for one supervisor's children: made
    before the first fork, a dead child's live gauges removed when it is
    reaped (its counters stay, so the group's totals never go down), the
    whole directory removed at exit."""

    def __init__(self) -> None:
        from prometheus_client import values

        self.path = tempfile.mkdtemp(prefix="shardq-metrics-")
        self._previous = (os.environ.get("PROMETHEUS_MULTIPROC_DIR"), values.ValueClass)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.path
        # prometheus_client chose its value class when first imported, maybe
        # before the variable was set (another app imported it): children
        # must write to files. The pid is read again in each child.
        values.ValueClass = values.MultiProcessValue()

    def child_exited(self, pid: int) -> None:
        from prometheus_client import multiprocess as client_multiprocess

        client_multiprocess.mark_process_dead(pid, self.path)

    def registry(self) -> Any:
        client = import_client()
        from prometheus_client import multiprocess as client_multiprocess

        registry = client.CollectorRegistry()
        client_multiprocess.MultiProcessCollector(registry, path=self.path)
        return registry

    def remove(self) -> None:
        """Delete the directory and put the process's settings back."""
        from prometheus_client import values

        shutil.rmtree(self.path, ignore_errors=True)
        path, values.ValueClass = self._previous
        if path is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = path


class Endpoint:
    """The HTTP server of ``--metrics-port`` (prometheus_client's, on a daemon thread)."""

    def __init__(self, port: int, registry: Any, address: str = "127.0.0.1") -> None:
        client = import_client()
        self.server, self.thread = client.start_http_server(port, addr=address, registry=registry)

    def close_in_child(self) -> None:
        """In a forked child: drop the inherited listening socket (only the
        supervisor serves; the thread does not exist here)."""
        self.server.socket.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
