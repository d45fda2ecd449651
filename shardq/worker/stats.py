"""Worker counters, published in ``shardq_worker.stats`` at every heartbeat."""

import threading

COUNTERS = (
    "claimed",
    "succeeded",
    "failed",
    "retried",
    "fence_rejections",
    "reexecutions",
    "self_fences",
    "rescued",
    "shard_claims",
    "takeovers",
    "releases",
    "returned",
    "recalled",
    "ticks",
    "db_errors",
    # Error domains (DESIGN §5)
    "start_writes",  # group-committed start statements (started ÷ these: the threads that began together)
    "started",  # jobs whose start write committed (a thread then ran them)
    "ack_writes",  # complete_jobs statements (outcomes written ÷ these: the ack batch)
    "acks_carried",  # outcomes written by a start write they rode on (no ack statement of their own)
    "ack_flushes",  # synchronous commits that made the carried outcomes durable (one per flush interval)
    "claim_statements",  # claim_jobs statements (claimed ÷ these: the claim batch; empty ones count)
    "told_claims",  # of those, claims of only the shards a NOTIFY told of (quiet: Fetcher.told_shards)
    "starts_refused",  # start writes that found the claim superseded (the job is not run)
    "quarantined",  # unreadable rows failed at claim
    "outcomes_refused",  # outcomes PostgreSQL refused to store (the job failed instead)
    "claim_errors",  # claims PostgreSQL refused whole
    "bad_notifies",  # NOTIFY payloads that name no shard
    # Priority: jobs that overtook ones already in this worker's memory
    "outranking_claims",  # claims outside demand for jobs a NOTIFY said outrank the buffer
    "heartbeats",
    # Run control (runcontrol.py)
    "timeouts",  # attempts that reached their deadline (their outcome written then)
    "late_completions_refused",  # what a timed-out attempt produced afterwards, dropped
    "cancels_seen",  # running attempts told of their cancel (is_cancelled(), CancelledError)
    "zombies",  # now: threads stuck in a task past its timeout (a gauge, not a counter)
    "shard_count_changes",  # a reshard raised the cluster's shard count (shardq_reshard)
    # The workflow resolver: children moved on (READY or FAILED), of them
    # cancelled with ParentFailed, and passes PostgreSQL refused.
    "children_moved",
    "children_cancelled",
    "resolver_errors",
    # Durable jobs (shardq/durable.py): batches committed, attempts handed
    # back at a boundary (shutdown, handover), stopped at one by a cancel,
    # suspended, woken by time (the waker), and its passes refused.
    "durable_batches",
    "handed_back_at_boundary",
    "durable_cancelled",
    "suspended",
    "woken",
    "waker_errors",
    # Deploy safety (handback.py): jobs handed back because this worker
    # cannot resolve their task, and those dead-lettered after
    # SHARDQ["UNKNOWN_TASK_TIMEOUT"].
    "unknown_task_deferrals",
    "unknown_task_dead",
    # Live queue controls (queuecontrol.py): claimed jobs handed back because
    # their queue was paused, or over its concurrency override here.
    "paused_handed_back",
    "over_queue_concurrency",
    # History (archiver.py): jobs moved to shardq_job_history, jobs deleted
    # instead (finished before the oldest partition: past the retention),
    # partitions made ahead and dropped past the retention, passes refused.
    "archived",
    "expired_unarchived",
    "history_partitions_created",
    "history_partitions_dropped",
    "archiver_errors",
    # Dead-owner detection (leaser.py): checks for peers whose lease session
    # is gone, peers found dead (gone for two checks), and shards taken from
    # them before their leases expired.
    "dead_owner_checks",
    "dead_owners",
    "dead_owner_takeovers",
)


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def set(self, name: str, value: int) -> None:
        """A gauge's current value (``zombies``)."""
        with self._lock:
            self._values[name] = value

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values[name]
