"""shardq's settings: ``settings.SHARDQ`` merged over the defaults."""

from dataclasses import dataclass

from django.conf import settings

DEFAULTS = {
    "SHARD_COUNT": 64,
    "LEASE_TTL": 30.0,
    "HEARTBEAT": 10.0,
    "POLL_INTERVAL": 1.0,
    "NOTIFY": True,
    "CHANNEL": "shardq",
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    "TASK_MODULES": [],
    "COMPLETION_BATCH": 256,
    "COMPLETION_FLUSH_SECONDS": 0.005,
    # A job whose attempt was interrupted by a lost worker runs again this
    # many times at most, then is dead-lettered as WorkerLost.
    "MAX_WORKER_LOSSES": 3,
    # A task's return value as JSON, at most: larger fails the job.
    "MAX_RESULT_BYTES": 1024 * 1024,
    # shardq_worker serves Prometheus metrics on this port (None: metrics off);
    # --metrics-port overrides it.
    "METRICS_PORT": None,
}


@dataclass(frozen=True, slots=True)
class Config:
    shard_count: int
    lease_ttl_seconds: float
    heartbeat_seconds: float
    poll_interval_seconds: float
    notify: bool
    channel: str
    max_payload_bytes: int
    task_modules: tuple
    completion_batch: int
    completion_flush_seconds: float
    max_worker_losses: int = 3
    max_result_bytes: int = 1024 * 1024


def get_config() -> Config:
    raw = {**DEFAULTS, **getattr(settings, "SHARDQ", {})}
    return Config(
        shard_count=raw["SHARD_COUNT"],
        lease_ttl_seconds=float(raw["LEASE_TTL"]),
        heartbeat_seconds=float(raw["HEARTBEAT"]),
        poll_interval_seconds=float(raw["POLL_INTERVAL"]),
        notify=bool(raw["NOTIFY"]),
        channel=str(raw["CHANNEL"]),
        max_payload_bytes=int(raw["MAX_PAYLOAD_BYTES"]),
        task_modules=tuple(raw["TASK_MODULES"]),
        completion_batch=int(raw["COMPLETION_BATCH"]),
        completion_flush_seconds=float(raw["COMPLETION_FLUSH_SECONDS"]),
        max_worker_losses=int(raw["MAX_WORKER_LOSSES"]),
        max_result_bytes=int(raw["MAX_RESULT_BYTES"]),
    )
