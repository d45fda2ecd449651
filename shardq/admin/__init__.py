"""The operator's admin (DESIGN §7): shard map, workers, jobs with the
dead-letter actions, shard events, and a dashboard of throughput, lag and
pickup latency per shard.

Everything here is read-only except two actions. Shard ownership belongs to
the lease protocol, worker rows to their processes and job rows to the
worker runtime, so no admin page adds, edits or deletes a row. The two
writes are the dead-letter actions on jobs, each one compare-and-set
statement from ``shardq/db/sql/`` (``admin_retry_failed_jobs``,
``admin_discard_failed_jobs``) behind its own permission
(``shardq.retry_job``, ``shardq.discard_job``), logged in the admin's
history. Ages and lease times are computed by the database clock
(``clock_timestamp()``), as the lease protocol computes them, never by the
web server's.

Arguments a task marks ``sensitive`` are shown as ``"[redacted]"``
everywhere (``shardq.admin.redaction``); a job whose task this
process cannot resolve has every argument hidden.
"""

from . import dashboard, history, jobs, limits, queues, shards, workers  # noqa: F401 (each registers its model admins)
from .common import human_seconds  # noqa: F401
from .shards import ShardAdmin  # noqa: F401
from .workers import WorkerAdmin  # noqa: F401
