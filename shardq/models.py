"""The schema (DESIGN §3). Hot paths use the SQL of ``shardq/db/sql/``;
these models are the one schema source and what the admin reads."""

from django.db import models
from django.db.models import ExpressionWrapper, F, Q
from django.db.models.functions import Collate, Length
from django.db.models.lookups import LessThanOrEqual
from django.tasks import TaskResultStatus

# Django's four statuses plus CLAIMED: taken into a worker's memory but not
# started. Django's API shows a CLAIMED job as READY (it has not begun
# execution); the start write makes it RUNNING and counts the attempt.
# WAITING: a workflow job whose parents have not all finished (never
# claimable, not in the claim index); Django's API shows it as READY too.
# SUSPENDED: a durable job asleep or waiting for a signal (shardq/durable.py)
# until ``run_after`` (9999-12-01: a wait with no timeout); not in the claim index.
# It has started, so Django's API shows it as RUNNING.
JOB_STATUSES = [
    *TaskResultStatus.choices,
    ("CLAIMED", "Claimed"),
    ("WAITING", "Waiting"),
    ("SUSPENDED", "Suspended"),
]
# A job taken by a worker (CLAIMED) or begun by one of its threads (RUNNING):
# the statuses of shardq_job_inflight_idx, left out of the search index by
# keyword argument (shardq_job_kwargs_idx).
IN_FLIGHT = ("CLAIMED", "RUNNING")


class GinIndex(models.Index):
    """A GIN index (``USING gin``) without django.contrib.postgres, whose
    GinIndex needs it in INSTALLED_APPS: the same CREATE INDEX."""

    suffix = "gin"

    def create_sql(self, model, schema_editor, using="", **kwargs):
        return super().create_sql(model, schema_editor, using=" USING gin", **kwargs)


class HashIndex(models.Index):
    """A hash index (``USING hash``): equality only, and any length of value,
    where a btree refuses an entry over 2,704 bytes (a shard key may be longer)."""

    suffix = "hash"

    def create_sql(self, model, schema_editor, using="", **kwargs):
        return super().create_sql(model, schema_editor, using=" USING hash", **kwargs)


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    task_path = models.CharField(max_length=300)
    backend = models.CharField(max_length=100, default="default")
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    run_after = models.DateTimeField()
    # shard = key_hash & (SHARD_COUNT - 1), computed at write time.
    shard = models.SmallIntegerField()
    # Signed 32-bit MurmurHash3 of the shard key: a power-of-two reshard is one
    # UPDATE (new shard = old or old + old count), never a rehash.
    key_hash = models.IntegerField()
    shard_key = models.TextField(null=True, blank=True)
    ordered = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=JOB_STATUSES, default=TaskResultStatus.READY)
    # Monotonic state version: +1 at every transition (claim, ack, retry,
    # rescue, return). An ack carries the rank its claim produced + 1, so a
    # late message from an earlier claim can never move the job backwards.
    status_rank = models.IntegerField(default=0)
    # The shard's claim_version under which the row was last claimed or fenced.
    fence = models.BigIntegerField(default=0)
    # Attempts that really started (counted by the start write, not the claim).
    attempts = models.IntegerField(default=0)
    # Attempts interrupted by a lost worker (crash, lost lease): such a job
    # runs again until SHARDQ["MAX_WORKER_LOSSES"], then is dead-lettered.
    worker_losses = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(default=1)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    return_value = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)
    # Per-job logs (shardq/worker/joblogs.py): one {"attempt": n, "text": ...}
    # an attempt whose task logged something, oldest first, at most
    # SHARDQ["JOB_LOG_BYTES"] of text in all. NULL: nothing logged.
    logs = models.JSONField(null=True, blank=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    # Workflows (shardq/workflows.py): the parents a WAITING job still waits
    # for (its unresolved edges), whether this job has children the resolver
    # has not moved on yet, and the name of the workflow it was enqueued in.
    waiting_on = models.IntegerField(default=0, db_default=0)
    children_pending = models.BooleanField(default=False, db_default=False)
    workflow = models.TextField(null=True, blank=True)
    # The limits this job counts against (shardq/limits.py), sorted; NULL for
    # a job no limit applies to. Limited jobs are claimed by their own
    # statement (claim_limited_candidates), never by claim_jobs.
    # A JSON array of text (jsonb: ``?|`` tests it against a list of keys,
    # with no need for django.contrib.postgres in INSTALLED_APPS).
    limit_keys = models.JSONField(null=True, blank=True)
    # A limit partitioned by the shard key itself (max_concurrency with
    # limit_by naming the key, no salt, no other limit): the key's one owner
    # enforces it in its local queue (docs/limits.md, "Limits by the shard
    # key"), so the job has no limit_keys and takes the ordinary claim. Set
    # so claim_jobs can hold such a job back where two pools hold its shard.
    key_limited = models.BooleanField(default=False, db_default=False)
    # The W3C traceparent of the span that enqueued the job (shardq[otel],
    # shardq/tracing.py): each attempt's span is its child. NULL: untraced.
    traceparent = models.TextField(null=True, blank=True)
    # Since when no worker could resolve the job's task path (a deploy in
    # progress): it is handed back, not failed, until
    # SHARDQ["UNKNOWN_TASK_TIMEOUT"] has passed (shardq/worker/handback.py).
    unknown_task_since = models.DateTimeField(null=True, blank=True)
    # Fair share inside a queue (docs/fairness.md): the key whose share the
    # job counts against (its text, or #sha256:<hex> of a long one) and the
    # job's own weight (NULL: SHARDQ["FAIRNESS"]["WEIGHTS"], else 1). NULL
    # for a job without one, which is claimed and run exactly as before.
    fair_key = models.TextField(null=True, blank=True)
    fair_weight = models.IntegerField(null=True, blank=True)
    # Labels for finding jobs (docs/admin.md, "Tags and search"):
    # @shard_task(tags=[...]) or .using(tags=[...]), a JSON array of text,
    # sorted and without duplicates; NULL for a job without tags, which is
    # then in no tag index. jsonb rather than text[], as limit_keys: the same
    # GIN index and ``@>`` test, with no need for django.contrib.postgres in
    # INSTALLED_APPS.
    tags = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "shardq_job"
        indexes = [
            # The per-shard claims walk this index range (DESIGN §5): a
            # shard's unlimited READY jobs in claim order for claim_jobs
            # (``limit_keys IS NULL``), its limited ones for
            # claim_limited_candidates (``(limit_keys IS NULL) IS FALSE``),
            # each an equality on the second column, so neither walk passes
            # over the other's rows: a backlog of limited jobs (a rate limit's,
            # say) costs the unlimited claim nothing. (A partial index of
            # limited jobs beside one of every READY job, as before, made each
            # claim_jobs probe filter out every limited row of the shard: 11 ms
            # a claim at 20,000 of them, linear in the backlog.)
            # The third column sets apart the unlimited jobs with a fair key
            # (docs/fairness.md): claim_jobs' ordinary walk takes the range
            # where it is false (every job without a fair key: the same walk
            # as before), claim_tops' probe of the fair ones the range where
            # it is true, and a limited job has it false always.
            models.Index(
                F("shard"),
                ExpressionWrapper(Q(limit_keys__isnull=True), output_field=models.BooleanField()),
                ExpressionWrapper(
                    Q(fair_key__isnull=False, limit_keys__isnull=True), output_field=models.BooleanField()
                ),
                F("priority").desc(),
                F("run_after"),
                F("id"),
                condition=Q(status="READY"),
                name="shardq_job_ready_idx",
            ),
            # The claim's round over the fair keys with backlog at a priority
            # level, across the worker's shards (one probe per key: the next
            # (key, shard) after the last one), then each key's head on a
            # shard in claim order (docs/fairness.md). Keys in byte order
            # (COLLATE "C"): the worker's turn after the last key taken is
            # a Python string comparison. Only unlimited READY jobs with a
            # fair key are in it.
            models.Index(
                F("priority").desc(),
                Collate(F("fair_key"), "C"),
                F("shard"),
                F("run_after"),
                F("id"),
                condition=Q(status="READY", fair_key__isnull=False, limit_keys__isnull=True),
                name="shardq_job_fair_idx",
            ),
            # An idle fetcher finds when the next deferred job falls due.
            models.Index(fields=["run_after"], condition=Q(status="READY"), name="shardq_job_due_idx"),
            # Takeover rescue finds a shard's in-flight jobs through this one.
            models.Index(
                fields=["shard"],
                condition=Q(status__in=["CLAIMED", "RUNNING"]),
                name="shardq_job_inflight_idx",
            ),
            # Where several pools hold a shard, a claim checks an ordered
            # job's earlier jobs of the same key through this one (only
            # ordered, unfinished jobs are in it).
            models.Index(
                fields=["shard", "shard_key", "id"],
                condition=Q(ordered=True, status__in=["READY", "CLAIMED", "RUNNING"]),
                name="shardq_job_ordered_idx",
            ),
            # The same check for a job limited by its shard key (key_limited):
            # its task's earlier jobs of the key in flight under another lease.
            models.Index(
                fields=["shard", "shard_key", "id"],
                condition=Q(key_limited=True, status__in=["READY", "CLAIMED", "RUNNING"]),
                name="shardq_job_key_limited_idx",
            ),
            # The resolver finds its shards' finished parents whose children
            # it has not moved on yet (empty when no workflow is running).
            models.Index(
                fields=["shard", "id"],
                condition=Q(children_pending=True, status__in=["SUCCESSFUL", "FAILED"]),
                name="shardq_job_resolve_idx",
            ),
            # WAITING jobs are counted (gauges, shardq_status) through this
            # one; they are in no index the claim walks.
            models.Index(fields=["shard"], condition=Q(status="WAITING"), name="shardq_job_waiting_idx"),
            # The waker finds its shards' suspended jobs that fall due through
            # this one (shardq/worker/waker.py); they are in no index the claim walks.
            models.Index(
                fields=["shard", "run_after"], condition=Q(status="SUSPENDED"), name="shardq_job_suspended_idx"
            ),
            # An ordered key with a suspended job: the claim passes over the
            # key's other jobs until it finishes (claim_key_suspended; docs/durable.md).
            models.Index(
                fields=["shard", "shard_key"],
                condition=Q(ordered=True, status="SUSPENDED"),
                name="shardq_job_ordered_susp_idx",
            ),
            # Jobs by tag (``tags @> ARRAY['billing']``): only tagged jobs are
            # in it, so an untagged job's writes never touch it.
            GinIndex(
                fields=["tags"],
                opclasses=["jsonb_path_ops"],
                condition=Q(tags__isnull=False),
                name="shardq_job_tags_idx",
            ),
            # Jobs by a keyword argument's value (``kwargs @> '{"customer_id": 7}'``;
            # shardq.jobs(where=...), the admin's ``customer_id=7`` search).
            # jsonb_path_ops: one hashed entry per value path, smaller and
            # cheaper to write than jsonb_ops; it answers @> only, all the
            # search needs. Not the in-flight versions (CLAIMED, RUNNING):
            # a job's claim and start would each add an entry (every update
            # of a job is a new version in every index it matches), two of
            # the four a no-op job wrote; the search reads the few jobs in
            # flight through shardq_job_inflight_idx instead
            # (shardq/search.py, argument_filter). Its cost on the hot path:
            # docs/benchmarks.md, "Search index cost".
            GinIndex(
                fields=["kwargs"],
                opclasses=["jsonb_path_ops"],
                condition=~Q(status__in=IN_FLIGHT),
                name="shardq_job_kwargs_idx",
            ),
            # The admin's job list at ten million rows (docs/admin.md): a
            # task's jobs newest first, however rare the task (the list is
            # ordered by -id, so the walk stops after a page).
            models.Index(fields=["task_path", "-id"], name="shardq_job_task_idx"),
            # The exact shard-key search (jobs without a key are not in it): a
            # hash index, since a btree refuses a key over 2,704 bytes, which
            # the enqueue accepts (tests/isolation/test_row_properties.py).
            HashIndex(fields=["shard_key"], condition=Q(shard_key__isnull=False), name="shardq_job_key_idx"),
            # The dead-letter queue, newest first: only dead letters are in it.
            models.Index(
                F("id").desc(),
                condition=Q(status="FAILED", attempts__gte=F("max_attempts")),
                name="shardq_job_dead_idx",
            ),
            # The dashboard's window of finished jobs, the FAILED ones still
            # in shardq_job (dead letters stay; the archivable ones are in
            # shardq_job_archivable_idx): a range of finished_at, never a read
            # of every dead letter. A job that succeeds never enters it.
            models.Index(fields=["finished_at"], condition=Q(status="FAILED"), name="shardq_job_failed_idx"),
            # The dashboard's dead letters per shard: an index-only count (the
            # dead-letter index by id sends it to the heap for each shard).
            models.Index(
                fields=["shard"],
                condition=Q(status="FAILED", attempts__gte=F("max_attempts")),
                name="shardq_job_dead_shard_idx",
            ),
        ]
        # A fair key fits shardq_job_fair_idx (a btree entry holds at most
        # 2,704 bytes): enqueue stores a key over 200 characters as its
        # SHA-256, so only a row written by hand could hold a longer one.
        constraints = [
            models.CheckConstraint(
                condition=Q(LessThanOrEqual(Length("fair_key"), 600)), name="shardq_job_fair_key_length"
            )
        ]
        # The admin's dead-letter actions, each behind its own permission.
        permissions = [
            ("retry_job", "Can retry failed jobs (back to READY with fresh attempts)"),
            ("discard_job", "Can discard (delete) failed jobs"),
            ("cancel_job", "Can cancel unfinished jobs"),
            ("run_job_now", "Can make deferred READY jobs due now"),
        ]

    def __str__(self):
        return f"{self.task_path}#{self.pk} ({self.status})"


def _history_fields() -> dict[str, models.Field]:
    """Every field of Job, for JobHistory: the same columns (the archiver moves
    rows with ``INSERT ... SELECT *``), the id a plain bigint (a moved job keeps
    the id it was given in shardq_job)."""
    fields: dict[str, models.Field] = {}
    for field in Job._meta.local_fields:
        _name, _path, args, kwargs = field.deconstruct()
        if field.primary_key:
            fields[field.name] = models.BigIntegerField(primary_key=True)
        else:
            fields[field.name] = type(field)(*args, **kwargs)
    return fields


class JobHistoryMeta:
    db_table = "shardq_job_history"
    # The table is migration 0022's SQL: partitioned by finish time, which
    # Django's schema editor cannot create.
    managed = False
    verbose_name = "job history"
    verbose_name_plural = "job history"
    default_permissions = ("view",)


# Finished jobs moved out of shardq_job by the archiver (shardq/worker/archiver.py,
# docs/architecture.md "History"): read-only, the admin's "Job history" list.
JobHistory = type(
    "JobHistory",
    (models.Model,),
    {
        **_history_fields(),
        "__module__": __name__,
        "__doc__": "A finished job in shardq_job_history (partitioned by finish time).",
        "Meta": JobHistoryMeta,
        "__str__": Job.__str__,
    },
)


class Shard(models.Model):
    """One lease: a shard as one pool (a worker queue selection) holds it.

    Each pool covers every shard of its queues, so there is one row per
    (pool, shard); the pool ``*`` (a worker with no --queues) always exists.
    """

    id = models.BigAutoField(primary_key=True)
    # The worker selection that leases this row (shardq.core.pools.pool_name).
    pool = models.CharField(max_length=200, default="*", db_default="*")
    shard = models.SmallIntegerField()
    owner = models.UUIDField(null=True, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    # The fencing token, from one sequence for every row (shardq_claim_version_seq):
    # never decreases, never reused, so (shard, claim_version) names one lease
    # for ever; rows are never deleted.
    claim_version = models.BigIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "shardq_shard"
        ordering = ["pool", "shard"]
        constraints = [models.UniqueConstraint(fields=["pool", "shard"], name="shardq_shard_pool_shard_uniq")]
        # Acks, starts and rescues find a job's lease by (shard, fence).
        indexes = [models.Index(fields=["shard", "claim_version"], name="shardq_shard_version_idx")]

    def __str__(self):
        return f"shard {self.shard}" if self.pool == "*" else f"shard {self.shard} of pool {self.pool}"


class Dashboard(Shard):
    """The admin's dashboard (throughput, lag and pickup latency per shard).

    A proxy with no table of its own: it gives the page an admin URL
    (``admin/shardq/dashboard/``), an entry in the admin index and its own
    permission, ``shardq.view_dashboard``.
    """

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ("view",)


class ShardEvent(models.Model):
    """History of shard ownership: who took or gave up which version, and why."""

    class Reason(models.TextChoices):
        CLAIM = "claim"
        TAKEOVER = "takeover"
        RELEASE = "release"

    id = models.BigAutoField(primary_key=True)
    pool = models.CharField(max_length=200, default="*", db_default="*")
    shard = models.SmallIntegerField()
    claim_version = models.BigIntegerField()
    worker = models.UUIDField()
    reason = models.CharField(max_length=10, choices=Reason.choices)
    rescued = models.IntegerField(default=0)
    at = models.DateTimeField()

    class Meta:
        db_table = "shardq_shard_event"
        indexes = [models.Index(fields=["shard", "at"], name="shardq_shard_event_idx")]


class Worker(models.Model):
    class State(models.TextChoices):
        RUNNING = "RUNNING"
        STOPPING = "STOPPING"
        STOPPED = "STOPPED"

    id = models.UUIDField(primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    # The pool it leases shards in (shardq.core.pools.pool_name of its selection).
    pool = models.CharField(max_length=200, default="*", db_default="*")
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    # Counters (jobs_done, fence_rejections, self_fences, rescued, ...), written
    # at every heartbeat and at shutdown.
    stats = models.JSONField(default=dict)
    # A readable name (shardq_worker --worker-id), "" when none was given.
    name = models.CharField(max_length=100, blank=True, default="", db_default="")
    # Dead-owner detection (docs/reliability.md, "A worker that dies"): the
    # server session of this worker's lease connection, recorded at every
    # heartbeat: its backend pid and start, and the server's start
    # (pg_postmaster_start_time()), so a pid is only ever looked up on the
    # server that gave it. NULL: not recorded (detection off for this worker,
    # or a pooler between it and PostgreSQL): it is never taken for dead
    # before its leases expire.
    backend_pid = models.IntegerField(null=True, blank=True)
    backend_start = models.DateTimeField(null=True, blank=True)
    server_started = models.DateTimeField(null=True, blank=True)
    # Its LISTEN session, on the same server: gone with the lease session,
    # the whole process is gone (no grace before its shards are taken).
    listener_pid = models.IntegerField(null=True, blank=True)
    listener_start = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "shardq_worker"

    def __str__(self):
        return f"{self.host}:{self.pid} ({self.id})"


class UniqueKey(models.Model):
    """A unique task's key, taken by the job enqueued under it until ``expires_at``.

    One row a key ever used (a later job takes the row over once it has
    expired). Written and read only by the ``insert_unique_job`` statement,
    on the enqueuer's connection, so a key is taken exactly when the job's
    transaction commits. No foreign key to the job: a deleted job frees its
    key at the next enqueue of that key, and ``TRUNCATE shardq_job`` keeps
    working.
    """

    # Only ever compared for equality: byte order ("C") is the cheapest.
    key = models.TextField(primary_key=True, db_collation="C")
    job_id = models.BigIntegerField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "shardq_unique"

    def __str__(self):
        return f"{self.key} -> job {self.job_id} until {self.expires_at}"


class Cluster(models.Model):
    """The cluster's versioned settings: one row (id 1), read in SQL by every
    enqueue and claim, and by each worker's heartbeat.

    ``shard_count`` is the number of shards jobs are spread over: new jobs
    go to ``key_hash & (shard_count - 1)``. It starts at SHARDQ["SHARD_COUNT"]
    and changes only through ``manage.py shardq_reshard``, which bumps
    ``version``. While a reshard runs, ``reshard_from`` holds the count before
    it: jobs of one key may then sit in two shards of one family (``shard &
    (reshard_from - 1)``), and the claim keeps their order across the family
    (docs/architecture.md, "Resharding").
    """

    id = models.SmallIntegerField(primary_key=True, default=1)
    shard_count = models.IntegerField()
    version = models.BigIntegerField(default=1)
    reshard_from = models.IntegerField(null=True, blank=True)
    # When the count switched (database time): transactions begun before it
    # may still commit jobs placed with the old count.
    switched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "shardq_cluster"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="shardq_cluster_one_row")]

    def __str__(self):
        return f"{self.shard_count} shards (version {self.version})"


class Edge(models.Model):
    """One workflow edge: ``child`` waits for ``parent`` (shardq/workflows.py).

    ``name`` is the key of the parent's result in the child's
    ``context.parent_results``; ``run_on_failure`` is the child's
    ``on_parent_failure="run"``; ``resolved`` says the resolver has counted
    this edge (the child's ``waiting_on`` is its unresolved edges). No
    foreign keys, as ``shardq_unique``: ``TRUNCATE shardq_job`` keeps working.
    """

    pk = models.CompositePrimaryKey("parent", "child")
    parent = models.BigIntegerField()
    child = models.BigIntegerField()
    name = models.TextField()
    run_on_failure = models.BooleanField(default=False)
    resolved = models.BooleanField(default=False)

    class Meta:
        db_table = "shardq_edge"
        indexes = [models.Index(fields=["child"], name="shardq_edge_child_idx")]

    def __str__(self):
        return f"job {self.child} after job {self.parent}"


class LimitSlot(models.Model):
    """One unit of a concurrency limit (docs/limits.md): free when
    ``worker_id`` is NULL or ``expires_at`` has passed. A worker takes slots
    in a limited claim's transaction (SKIP LOCKED), lends them to its
    threads, renews them every half heartbeat and gives them back when no
    job of the limit waits there; a dead worker's come back when their lease
    expires."""

    id = models.BigAutoField(primary_key=True)
    limit_key = models.TextField()
    slot = models.IntegerField()
    worker_id = models.UUIDField(null=True, blank=True)
    taken_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "shardq_limit_slot"
        constraints = [models.UniqueConstraint(fields=["limit_key", "slot"], name="shardq_limit_slot_key_uniq")]
        indexes = [models.Index(fields=["worker_id"], name="shardq_limit_slot_worker_idx")]
        # The admin's "Limits" page (every limit, not only slots) is this model's.
        verbose_name = "limit"
        verbose_name_plural = "limits"


class LimitRate(models.Model):
    """One rate limit's GCRA state: ``tat``, the theoretical arrival time of
    the next token (shardq/core/limits.py), moved on by every grant."""

    limit_key = models.TextField(primary_key=True)
    tat = models.DateTimeField()

    class Meta:
        db_table = "shardq_limit_rate"
        verbose_name = "rate limit"


class JobStep(models.Model):
    """What a durable job recorded (shardq/durable.py), one row a name.

    ``kind`` says which call wrote it: ``step`` (``output`` is the step's
    JSON result), ``iterate`` (``output`` is ``{"cursor": ...}``, the
    position after the last batch committed, with ``batches`` done and the
    ``total`` when the source could count it; ``done`` once walked to the
    end), ``sleep`` (``until``: when it wakes) or ``wait`` (``output`` names
    the signal; ``done`` with its payload, or timed out; ``until``: the
    timeout). Every write is fenced by the attempt that made it (``fence``).
    No foreign key, as ``shardq_edge``: ``TRUNCATE shardq_job`` keeps working,
    and ``shardq_prune`` deletes a pruned job's rows."""

    pk = models.CompositePrimaryKey("job_id", "name")
    job_id = models.BigIntegerField()
    name = models.TextField()
    kind = models.CharField(max_length=10)
    output = models.JSONField(null=True, blank=True)
    fence = models.BigIntegerField()
    batches = models.IntegerField(default=0, db_default=0)
    total = models.BigIntegerField(null=True, blank=True)
    done = models.BooleanField(default=False, db_default=False)
    until = models.DateTimeField(null=True, blank=True)
    recorded_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "shardq_job_step"
        verbose_name = "durable step"

    def __str__(self):
        return f"job {self.job_id} {self.kind} {self.name}"


class JobSignal(models.Model):
    """A signal sent to a durable job (``shardq.signal``), kept until a
    ``context.wait_for`` of its name consumes it (``consumed_at``)."""

    id = models.BigAutoField(primary_key=True)
    job_id = models.BigIntegerField()
    name = models.TextField()
    payload = models.JSONField(null=True, blank=True)
    sent_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "shardq_job_signal"
        indexes = [models.Index(fields=["job_id", "name", "id"], name="shardq_job_signal_idx")]

    def __str__(self):
        return f"signal {self.name!r} to job {self.job_id}"


class QueueControl(models.Model):
    """An operator's live control of one queue (docs/operations.md, "Queue
    controls"): paused (no worker claims its jobs; enqueue still works and
    running jobs finish) and a concurrency override (at most that many of
    its jobs in each worker's memory at once). Written by
    ``manage.py shardq_queue`` and the admin's Queues page, each write
    followed by a NOTIFY on ``<CHANNEL>_queue``; every worker reads the
    table again on that NOTIFY and at every poll interval, so the state
    survives restarts and a lost notification."""

    queue_name = models.TextField(primary_key=True)
    paused = models.BooleanField(default=False, db_default=False)
    concurrency = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField()
    updated_by = models.TextField(default="", db_default="", blank=True)

    class Meta:
        db_table = "shardq_queue_control"
        verbose_name = "queue"
        verbose_name_plural = "queues"
        default_permissions = ("view", "change")
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency__isnull=True) | Q(concurrency__gte=1),
                name="shardq_queue_control_concurrency_gte_1",
            )
        ]

    def __str__(self):
        return f"queue {self.queue_name}"


class BulkOperation(models.Model):
    """One bulk action on every job matching a filter (shardq/bulk.py: the
    admin's "… all matching" buttons, ``manage.py shardq_jobs``): what it
    does, the filter it was given, how many jobs matched when it began, and
    its progress, written in each batch's own transaction."""

    id = models.BigAutoField(primary_key=True)
    action = models.CharField(max_length=20)
    filter = models.TextField()
    total = models.BigIntegerField()
    done = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)
    last_id = models.BigIntegerField(default=0)
    state = models.CharField(max_length=20)
    error = models.TextField(null=True, blank=True)
    started_by = models.TextField()
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "shardq_bulk_operation"
        default_permissions = ()

    def __str__(self):
        return f"bulk {self.action} #{self.pk}"
