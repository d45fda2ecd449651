"""The operator's admin (DESIGN §7): shard map, workers, jobs with the
dead-letter actions, shard events, and a dashboard of throughput, lag and
pickup latency per shard.

Everything here is read-only except two actions. Shard ownership belongs to
the lease protocol, worker rows to their processes and job rows to the
worker runtime, so no admin page adds, edits or deletes a row. The two
writes are the dead-letter actions on jobs, each one compare-and-set
statement from ``queries.sql`` (``admin_retry_failed_jobs``,
``admin_discard_failed_jobs``) behind its own permission
(``shardq.retry_job``, ``shardq.discard_job``), logged in the admin's
history. Ages and lease times are computed by the database clock
(``clock_timestamp()``), as the lease protocol computes them, never by the
web server's.

Arguments a task marks ``sensitive`` are shown as ``"[redacted]"``
everywhere (``shardq.tasks.redact_arguments``); a job whose task this
process cannot resolve has every argument hidden.
"""

import json
import math
import statistics
from functools import cache

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    IntegerField,
    JSONField,
    Min,
    OuterRef,
    Q,
    Subquery,
    TextField,
    When,
)
from django.db.models.constants import LOOKUP_SEP
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import format_html, format_html_join

from . import charts
from .conf import get_config
from .db import operations
from .db.queries import positional
from .exceptions import UnknownTask
from .limits import limit_report
from .models import Dashboard, Job, LimitSlot, Shard, ShardEvent, Worker
from .tasks import REDACTED, autodiscover, redact_arguments, resolve, shard_key_is_sensitive

# -- database-clock expressions ---------------------------------------------


class ClockTimestamp(Func):
    """``clock_timestamp()``: the database's clock, as the lease protocol reads it."""

    template = "clock_timestamp()"
    arity = 0


class SecondsUntil(Func):
    """Seconds from the database's clock to a timestamp (negative: past).

    Infinity-safe: PostgreSQL refuses ``'infinity' - clock_timestamp()``
    ("cannot subtract infinite timestamps"), so the difference is taken
    between epochs (numeric, exact to the microsecond): ±infinity gives
    ±Infinity instead of an error."""

    template = "(extract(epoch FROM %(expressions)s) - extract(epoch FROM clock_timestamp()))::float8"
    arity = 1
    output_field = FloatField()


class SecondsSince(Func):
    """Seconds from a timestamp to the database's clock (infinity-safe, as above)."""

    template = "(extract(epoch FROM clock_timestamp()) - extract(epoch FROM %(expressions)s))::float8"
    arity = 1
    output_field = FloatField()


class Epoch(Func):
    template = "extract(epoch FROM %(expressions)s)"
    arity = 1
    output_field = FloatField()


def seconds_between(start, end) -> Func:
    """``end - start`` in seconds, taken between epochs (infinity-safe, as above)."""
    return Func(
        Epoch(end), Epoch(start), template="(%(expressions)s)::float8", arg_joiner=" - ", output_field=FloatField()
    )


class FiniteTime(Func):
    """A timestamp column, or NULL when it is ±infinity: psycopg cannot load
    an infinite timestamp into a ``datetime``, so an odd row would fail the
    whole page."""

    template = "CASE WHEN isfinite(%(expressions)s) THEN %(expressions)s END"
    arity = 1
    output_field = DateTimeField()


class InfiniteTimeText(Func):
    """``'infinity'`` / ``'-infinity'`` for an infinite timestamp, else NULL."""

    template = "CASE WHEN NOT isfinite(%(expressions)s) THEN (%(expressions)s)::text END"
    arity = 1
    output_field = TextField()


def with_safe_times(queryset, fields):
    """``queryset`` with the timestamp ``fields`` deferred (never loaded) and
    read through ``<field>_finite`` / ``<field>_infinite`` instead (see
    ``time_column``)."""
    annotations = {}
    for name in fields:
        annotations[f"{name}_finite"] = FiniteTime(F(name))
        annotations[f"{name}_infinite"] = InfiniteTimeText(F(name))
    return queryset.defer(*fields).annotate(**annotations)


# Times to the second (Django's default format stops at the minute, and a
# job often lives less than one), in the current time zone; the exact value
# with its microseconds and offset is in the element's datetime and title.
TIME_FORMAT = "Y-m-d H:i:s"


def show_time(value, infinite: str | None = None):
    """A timestamp to the second, as ``<time>``; ``infinite`` is the text of
    an infinite one (``with_safe_times``)."""
    if infinite:
        return infinite
    if value is None:
        return "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    exact = local.isoformat()
    return format_html('<time datetime="{}" title="{}">{}</time>', exact, exact, format_date(local, TIME_FORMAT))


def time_column(name: str, description: str):
    """A display method for a timestamp read through ``with_safe_times``."""

    @admin.display(description=description, ordering=name)
    def show(self, obj):
        return show_time(getattr(obj, f"{name}_finite", None), getattr(obj, f"{name}_infinite", None))

    show.__name__ = f"{name}_display"
    return show


# -- formatting --------------------------------------------------------------


def human_seconds(value: float | None) -> str:
    """A duration for people: ms below a second, then s, min, h."""
    if value is None:
        return "—"
    if not math.isfinite(value):  # a row with an infinite timestamp
        return "∞" if value > 0 else ("−∞" if value < 0 else "—")
    if abs(value) < 1:
        return f"{value * 1000:.1f} ms"
    if abs(value) < 120:
        return f"{value:.2f} s"
    if abs(value) < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def seconds_html(value: float | None):
    """A duration with its exact value in ``data-seconds`` (for people and tests)."""
    if value is None:
        return "—"
    return format_html(
        '<span data-seconds="{}">{}</span>',
        f"{value:.6f}" if math.isfinite(value) else str(value),
        human_seconds(value),
    )


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def short_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def truncate(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Return values, tracebacks and other stored text are shown as bounded
# excerpts: a 50 MB result must not be read into the web process or served.
EXCERPT_CHARS = 10 * 1024
# Arguments larger than this (as JSON text) are not loaded at all: the
# redaction needs them parsed, and a page must stay small.
ARGUMENTS_MAX_BYTES = 64 * 1024
# Errors shown of a job: the oldest and the newest this many each.
ERRORS_SHOWN_EACH_END = 10


def excerpt(text: str, total_bytes: int | None = None, limit: int = EXCERPT_CHARS) -> str:
    """The first ``limit`` characters of ``text`` and, when that is not all
    of it, "… (N bytes)" with the whole value's size."""
    if total_bytes is None:
        if len(text) <= limit:
            return text
        total_bytes = len(text.encode("utf-8", "surrogatepass"))
    elif len(text) <= limit and len(text.encode("utf-8", "surrogatepass")) >= total_bytes:
        return text
    return f"{text[:limit]}… ({total_bytes} bytes)"


def _pre(text: str):
    return format_html('<pre class="shardq-pre">{}</pre>', text)


# -- lists -------------------------------------------------------------------


class SnapshotChangeList(ChangeList):
    """A list whose count is the rows it shows.

    Django counts a list (one statement) and reads its rows (another, while
    the template renders); under READ COMMITTED each sees its own snapshot.
    Jobs change under a running worker every millisecond — right after a
    Retry the retried job runs and may fail again — so a page could say
    "1 result" over 2 rows. A list that fits one page is read here, once,
    and counted from what was read. (A longer list keeps Django's count:
    its page is bounded by LIMIT and the count is of the whole list.)
    """

    def get_results(self, request):
        super().get_results(request)
        if self.multi_page and not (self.show_all and self.can_show_all):
            return
        limit = self.list_max_show_all if self.show_all else self.list_per_page
        rows = list(self.queryset[: limit + 1])
        # More rows than the count promised a page: rows arrived in between;
        # show a page of them, the rest is on the next load.
        self.result_list = rows[:limit]
        self.result_count = len(self.result_list)


class ShardqModelAdmin(admin.ModelAdmin):
    """What every shardq list shares: the stylesheet, no exact total count
    (a scan of a large table), no facets, and counts that match the rows."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    class Media:
        css = {"all": ["shardq/admin.css"]}

    def get_changelist(self, request, **kwargs):
        return SnapshotChangeList


# -- tasks, as this process knows them ---------------------------------------


def task_of(task_path):
    """The Task a job names, or None when this process has not registered it
    (its arguments and shard key are then all hidden: their sensitivity is
    unknown).

    Only the task registry is asked: the tasks the installed apps' ``tasks``
    modules and ``SHARDQ["TASK_MODULES"]`` define (imported once, by
    configuration). A row's ``task_path`` is never imported — viewing a job
    must not run whatever module a row names."""
    if not isinstance(task_path, str):
        return None
    if task_path not in registered_paths():
        return None
    try:
        return resolve(task_path)  # a registered path: answered from the registry, no import
    except UnknownTask:
        return None


def registered_paths() -> frozenset[str]:
    """The task paths registered in this process, after the configured
    modules have been imported once."""
    from .tasks import registered_task_paths

    discover_tasks()
    return frozenset(registered_task_paths())


@cache
def discover_tasks() -> None:
    """Import the configured task modules once (never a row's task path)."""
    autodiscover(get_config().task_modules)


def known_task_paths() -> tuple[str, ...]:
    """Task paths defined in this process (installed apps' ``tasks`` modules
    and ``SHARDQ["TASK_MODULES"]``): the task filter's choices, found without
    scanning ``shardq_job``."""
    return tuple(sorted(registered_paths()))


def shown_key_task_paths() -> list[str]:
    """Registered tasks whose shard key the admin shows (not sensitive): the
    only jobs the exact shard-key search may match."""
    return [p for p in known_task_paths() if not shard_key_is_sensitive(task_of(p))]


def configured_queues() -> list[str]:
    """Queue names of the configured task backends (the queue filter's choices)."""
    queues = {"default"}
    for options in getattr(settings, "TASKS", {}).values():
        queues.update(options.get("QUEUES") or ())
    return sorted(queues)


def is_dead_lettered(job: Job) -> bool:
    return job.status == "FAILED" and job.attempts >= job.max_attempts


# -- shards ------------------------------------------------------------------


class LeaseFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("held", "held (unexpired)"), ("expired", "expired"), ("none", "no owner")]

    def queryset(self, request, queryset):
        if self.value() == "held":
            return queryset.filter(owner__isnull=False, lease_left_seconds__gt=0)
        if self.value() == "expired":
            return queryset.filter(owner__isnull=False, lease_left_seconds__lte=0)
        if self.value() == "none":
            return queryset.filter(owner__isnull=True)
        return queryset


def worker_link(worker_id, host, pid):
    """``host:pid`` linking to the worker's page, then its id."""
    if worker_id is None or worker_id == "":
        return "—"
    try:
        url = reverse("admin:shardq_worker_change", args=[worker_id])
    except NoReverseMatch:  # an odd value: shown, not linked
        return format_html('<span class="shardq-id">{}</span>', truncate(str(worker_id), 80))
    if host is None:  # the worker's row is gone (pruned)
        return format_html('<a href="{}" class="shardq-id">{}</a>', url, worker_id)
    return format_html(
        '<a href="{}">{}:{}</a> <span class="shardq-id" title="{}" data-worker-id="{}">{}</span>',
        url,
        host,
        pid,
        worker_id,
        worker_id,
        str(worker_id)[:8],
    )


@admin.register(Shard)
class ShardAdmin(ShardqModelAdmin):
    """The shard map: one row a lease, (pool, shard), with its READY backlog.

    Shards are leased per pool (the queues a worker serves): each pool holds
    every shard once, so a shard shows once per pool that has run a worker.
    The READY depth is the shard's, over all queues.
    """

    list_display = (
        "shard",
        "pool",
        "owner_display",
        "lease_left_display",
        "claim_version",
        "ready_depth_display",
        "oldest_ready_display",
        "claimed_at_display",
    )
    list_display_links = ("shard",)
    list_filter = (LeaseFilter, "pool")
    ordering = ("pool", "shard")
    # Every shard on one page (SHARD_COUNT is a power of two, 64 by default).
    list_per_page = 1024
    list_max_show_all = 4096
    fields = (
        "shard",
        "pool",
        "owner_display",
        "lease_left_display",
        "claim_version",
        "claimed_at_display",
        "ready_depth_display",
        "oldest_ready_display",
        "jobs_link",
        "recent_events",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        # Two correlated subqueries a shard, each an index range walk over
        # that shard's slice of shardq_job_ready_idx (shard, ...) WHERE
        # status = 'READY': no scan of the rest of the table.
        ready = Job.objects.filter(shard=OuterRef("shard"), status="READY").order_by().values("shard")
        depth = ready.annotate(n=Count("*")).values("n")
        oldest_due = ready.filter(run_after__lte=ClockTimestamp()).annotate(at=Min("run_after")).values("at")
        owner = Worker.objects.filter(id=OuterRef("owner"))
        return with_safe_times(super().get_queryset(request), ("lease_expires", "claimed_at")).annotate(
            ready_depth=Coalesce(Subquery(depth, output_field=IntegerField()), 0),
            oldest_ready_seconds=SecondsSince(Subquery(oldest_due)),
            lease_left_seconds=SecondsUntil(F("lease_expires")),
            owner_host=Subquery(owner.values("host")[:1]),
            owner_pid=Subquery(owner.values("pid")[:1]),
        )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # ownership is the lease protocol's

    def has_delete_permission(self, request, obj=None):
        return False  # rows are never deleted: claim_version must never be reused

    claimed_at_display = time_column("claimed_at", "claimed at")

    @admin.display(description="owner", ordering="owner")
    def owner_display(self, obj):
        if obj.owner is None:
            return "—"
        link = worker_link(obj.owner, obj.owner_host, obj.owner_pid)
        if obj.lease_left_seconds is not None and obj.lease_left_seconds <= 0:
            return format_html('{} <span class="shardq-badge shardq-dead">lease expired</span>', link)
        return link

    @admin.display(description="lease left", ordering="lease_left_seconds")
    def lease_left_display(self, obj):
        left = obj.lease_left_seconds
        if obj.owner is None or left is None:
            return "—"
        if left <= 0 or math.isnan(left):
            return format_html("expired {} ago", seconds_html(-left))
        return seconds_html(left)

    @admin.display(description="READY depth", ordering="ready_depth")
    def ready_depth_display(self, obj):
        return format_html('<span data-ready-depth="{}">{}</span>', obj.ready_depth, obj.ready_depth)

    @admin.display(description="oldest READY waits", ordering="oldest_ready_seconds")
    def oldest_ready_display(self, obj):
        return seconds_html(obj.oldest_ready_seconds)

    @admin.display(description="jobs")
    def jobs_link(self, obj):
        url = reverse("admin:shardq_job_changelist")
        return format_html(
            '<a href="{}?shard__exact={}&status__exact=READY">READY jobs</a> · '
            '<a href="{}?shard__exact={}">all jobs</a> of shard {}',
            url,
            obj.shard,
            url,
            obj.shard,
            obj.shard,
        )

    @admin.display(description="recent ownership events")
    def recent_events(self, obj):
        events = with_safe_times(ShardEvent.objects.filter(shard=obj.shard, pool=obj.pool), ("at",)).order_by("-at")[
            :20
        ]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((show_time(e.at_finite, e.at_infinite), e.reason, e.claim_version, e.worker, e.rescued) for e in events),
        )
        if not rows:
            return "none"
        return format_html(
            '<table class="shardq-table"><thead><tr><th>at</th><th>reason</th><th>claim version</th>'
            "<th>worker</th><th>jobs rescued</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )


# -- workers -----------------------------------------------------------------


# worker_liveness's values (shardq/db/queries.sql), and what each means.
LIVENESS = {
    "live": "RUNNING, heartbeat within LEASE_TTL ({ttl:g} s)",
    "stopping": "draining after a signal, heartbeat within LEASE_TTL ({ttl:g} s)",
    "dead": "no heartbeat for longer than LEASE_TTL ({ttl:g} s): its shards expire and are taken over",
    "stopped": "stopped gracefully",
}


def worker_liveness(ttl: float) -> RawSQL:
    """worker_liveness of queries.sql, the definition shardq_status uses too."""
    sql_text, params = positional("worker_liveness", {"ttl": ttl})
    return RawSQL(sql_text, params, output_field=TextField())


class LivenessFilter(admin.SimpleListFilter):
    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request, model_admin):
        return [(value, value) for value in LIVENESS]

    def queryset(self, request, queryset):
        if self.value() in LIVENESS:
            return queryset.filter(liveness=self.value())
        return queryset


@admin.register(Worker)
class WorkerAdmin(ShardqModelAdmin):
    """Worker incarnations: live, stopping, dead or stopped (worker_liveness
    in queries.sql, which shardq_status reads too)."""

    list_display = (
        "host",
        "pid",
        "liveness_display",
        "state",
        "shards_held_display",
        "heartbeat_age_display",
        "pool",
        "started_at_display",
        "counters_short",
        "id",
    )
    list_display_links = ("host",)
    list_filter = (LivenessFilter, "state", "pool")
    search_fields = ("=id", "host")
    ordering = ("-started_at",)
    fields = (
        "id",
        "host",
        "pid",
        "liveness_display",
        "state",
        "started_at_display",
        "heartbeat_at_display",
        "heartbeat_age_display",
        "pool",
        "queues_display",
        "shards_display",
        "counters_table",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        ttl = get_config().lease_ttl_seconds
        held = (
            Shard.objects.filter(owner=OuterRef("id"), lease_expires__gt=ClockTimestamp())
            .order_by()
            .values("owner")
            .annotate(n=Count("*"))
            .values("n")
        )
        return with_safe_times(super().get_queryset(request), ("started_at", "heartbeat_at")).annotate(
            heartbeat_age_seconds=SecondsSince(F("heartbeat_at")),
            shards_held=Coalesce(Subquery(held, output_field=IntegerField()), 0),
            # The lease protocol's rule (DESIGN §4), written once in
            # queries.sql: live = RUNNING with a heartbeat within LEASE_TTL.
            liveness=worker_liveness(ttl),
        )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # `manage.py shardq_prune` removes old incarnations

    started_at_display = time_column("started_at", "started at")
    heartbeat_at_display = time_column("heartbeat_at", "heartbeat at")

    @admin.display(description="liveness", ordering="liveness")
    def liveness_display(self, obj):
        title = LIVENESS.get(obj.liveness, "").format(ttl=get_config().lease_ttl_seconds)
        return format_html(
            '<span class="shardq-badge shardq-{}" data-liveness="{}" title="{}">{}</span>',
            obj.liveness,
            obj.liveness,
            title,
            obj.liveness,
        )

    @admin.display(description="shards held", ordering="shards_held")
    def shards_held_display(self, obj):
        return format_html('<span data-shards-held="{}">{}</span>', obj.shards_held, obj.shards_held)

    @admin.display(description="heartbeat age", ordering="-heartbeat_at")
    def heartbeat_age_display(self, obj):
        return seconds_html(obj.heartbeat_age_seconds)

    @admin.display(description="queues")
    def queues_display(self, obj):
        queues = obj.queues
        if not queues:
            return "all"
        if isinstance(queues, list) and all(isinstance(q, str) for q in queues):
            return truncate(", ".join(queues), 200)
        return truncate(short_json(queues), 200)  # an odd row: the raw value

    @admin.display(description="counters")
    def counters_short(self, obj):
        if not isinstance(obj.stats, dict):  # an odd row: the raw value
            return truncate(short_json(obj.stats), 160) if obj.stats is not None else "—"
        text = ", ".join(f"{k}={short_json(v)}" for k, v in sorted(obj.stats.items()) if v)
        return truncate(text, 160) or "—"

    @admin.display(description="counters")
    def counters_table(self, obj):
        stats = obj.stats
        if not isinstance(stats, dict):  # an odd row: the raw value, bounded
            return _pre(excerpt(short_json(stats)))
        if not stats:
            return "none yet (written at every heartbeat)"
        rows = format_html_join(
            "",
            "<tr><th>{}</th><td>{}</td></tr>",
            ((truncate(k, 200), truncate(short_json(v), 200)) for k, v in sorted(stats.items())[:500]),
        )
        return format_html('<table class="shardq-table">{}</table>', rows)

    @admin.display(description="shards held")
    def shards_display(self, obj):
        held = list(
            Shard.objects.filter(owner=obj.id, lease_expires__gt=ClockTimestamp())
            .order_by("shard")
            .values_list("shard", flat=True)
        )
        if not held:
            return "none"
        url = reverse("admin:shardq_shard_changelist")
        return format_html('{} (<a href="{}">shard map</a>)', ", ".join(map(str, held)), url)


# -- jobs --------------------------------------------------------------------


class DeadLetterFilter(admin.SimpleListFilter):
    """The dead-letter queue: FAILED with every attempt used."""

    title = "dead-letter queue"
    parameter_name = "dead_letter"

    def lookups(self, request, model_admin):
        return [("yes", "dead-lettered (FAILED, out of attempts)"), ("no", "not dead-lettered")]

    def queryset(self, request, queryset):
        dead = Q(status="FAILED", attempts__gte=F("max_attempts"))
        if self.value() == "yes":
            return queryset.filter(dead)
        if self.value() == "no":
            return queryset.exclude(dead)
        return queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [(q, q) for q in configured_queues()]

    def queryset(self, request, queryset):
        return queryset.filter(queue_name=self.value()) if self.value() else queryset


class TaskPathFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request, model_admin):
        # From the task registry, not SELECT DISTINCT over the whole table.
        return [(p, p) for p in known_task_paths()]

    def queryset(self, request, queryset):
        return queryset.filter(task_path=self.value()) if self.value() else queryset


BOTH_LOCATIONS = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]

# The job's timestamp columns, read through with_safe_times.
TIMES = ("enqueued_at", "run_after", "started_at", "last_attempted_at", "finished_at")
# Loaded only as bounded excerpts on the job's page (get_object).
OUTCOME_FIELDS = ("return_value", "errors", "worker_ids")
# No URL lookup on these (JobAdmin.lookup_allowed): arguments and outcomes
# are redacted or bounded, a shard key (and its hash) may be sensitive.
UNFILTERABLE_FIELDS = frozenset({"args", "kwargs", "return_value", "errors", "shard_key", "key_hash"})


def bounded_json(column: str) -> RawSQL:
    """``{"bytes": size of the value as JSON text, "value": the value when
    that is at most ARGUMENTS_MAX_BYTES, else null}``: a large value is
    never sent to the web process."""
    return RawSQL(
        f"(SELECT jsonb_build_object('bytes', octet_length(b.t), 'value', "
        f"CASE WHEN octet_length(b.t) <= %s THEN b.v END) "
        f"FROM (SELECT shardq_job.{column} AS v, shardq_job.{column}::text AS t) AS b)",
        [ARGUMENTS_MAX_BYTES],
        output_field=JSONField(),
    )


def json_excerpt(column: str) -> RawSQL:
    """``{"text": the first EXCERPT_CHARS characters of the value as JSON
    text, "chars": its length, "bytes": its size}``, or NULL for SQL NULL."""
    return RawSQL(
        f"(SELECT CASE WHEN b.t IS NOT NULL THEN jsonb_build_object('text', left(b.t, %s), "
        f"'chars', char_length(b.t), 'bytes', octet_length(b.t)) END "
        f"FROM (SELECT shardq_job.{column}::text AS t) AS b)",
        [EXCERPT_CHARS],
        output_field=JSONField(),
    )


def errors_excerpt() -> RawSQL:
    """``{"count": N, "errors": [...]}``: the oldest and the newest
    ERRORS_SHOWN_EACH_END errors, each with its class path and the first
    EXCERPT_CHARS characters of its traceback (and the traceback's size);
    an element that is not an object (an odd row) as its raw JSON text. A
    value that is not an array counts as one error."""
    return RawSQL(
        """(WITH e AS (
               SELECT x.e, x.n, count(*) OVER () AS total
               FROM jsonb_array_elements(CASE WHEN jsonb_typeof(shardq_job.errors) = 'array'
                                              THEN shardq_job.errors
                                              ELSE jsonb_build_array(shardq_job.errors) END)
                    WITH ORDINALITY AS x(e, n)
           )
           SELECT jsonb_build_object(
               'count', COALESCE(max(e.total), 0),
               'errors', COALESCE(jsonb_agg(
                   CASE WHEN jsonb_typeof(e.e) = 'object' THEN jsonb_build_object(
                       'n', e.n,
                       'exception_class_path', left(e.e ->> 'exception_class_path', 300),
                       'traceback', left(e.e ->> 'traceback', %s),
                       'traceback_bytes', octet_length(e.e ->> 'traceback'))
                   ELSE jsonb_build_object('n', e.n, 'raw', left(e.e::text, %s),
                                           'raw_bytes', octet_length(e.e::text)) END
                   ORDER BY e.n) FILTER (WHERE e.n <= %s OR e.n > e.total - %s), '[]'::jsonb))
           FROM e)""",
        [EXCERPT_CHARS, EXCERPT_CHARS, ERRORS_SHOWN_EACH_END, ERRORS_SHOWN_EACH_END],
        output_field=JSONField(),
    )


NOT_PARSED = object()


def parsed_excerpt(shown: dict):
    """The value of a ``json_excerpt`` when the excerpt is all of it, else NOT_PARSED."""
    if not isinstance(shown, dict) or shown.get("chars", 0) > EXCERPT_CHARS:
        return NOT_PARSED
    try:
        return json.loads(shown.get("text") or "")
    except ValueError:
        return NOT_PARSED


def excerpt_of_json(shown: dict) -> str:
    """A ``json_excerpt`` for people: pretty-printed when it is whole, else
    the first EXCERPT_CHARS characters and "… (N bytes)"."""
    value = parsed_excerpt(shown)
    if value is not NOT_PARSED:
        return excerpt(pretty_json(value))
    text = shown.get("text") or "" if isinstance(shown, dict) else ""
    return f"{text}… ({shown.get('bytes')} bytes)"


def worker_link_bare(worker_id):
    """A worker id (one attempt's) linking to the worker's page; an odd value
    (not a string, empty) shown as it is."""
    if isinstance(worker_id, str) and worker_id:
        try:
            url = reverse("admin:shardq_worker_change", args=[worker_id])
        except NoReverseMatch:
            pass
        else:
            return format_html('<a href="{}">{}</a>', url, truncate(worker_id, 80))
    return format_html('<span class="shardq-odd">{}</span>', truncate(short_json(worker_id), 80))


@admin.register(Job)
class JobAdmin(ShardqModelAdmin):
    """Jobs: filters, search, redacted arguments, readable tracebacks, and the
    dead-letter actions (Retry, Discard), each behind its own permission."""

    list_display = (
        "id",
        "task_path",
        "queue_name",
        "status_display",
        "attempts_display",
        "shard",
        "shard_key_display",
        "arguments_display",
        "enqueued_at_display",
        "waited_display",
        "ran_display",
        "finished_at_display",
    )
    list_filter = ("status", DeadLetterFilter, QueueFilter, TaskPathFilter)
    # The exact shard key is searched too (get_search_results), among the
    # jobs whose key the admin shows only.
    search_fields = ("=id", "task_path")
    search_help_text = "A job id, part of a task path, or an exact shard key."
    ordering = ("-id",)
    actions = ["retry_failed", "discard_failed"]
    fieldsets = (
        (None, {"fields": ("id", "task_path", "status_display", "queue_name", "priority", "backend")}),
        ("Arguments", {"fields": ("args_display", "kwargs_display", "redaction")}),
        ("Outcome", {"fields": ("return_value_display", "errors_display", "worker_ids_display")}),
        (
            "Shard and attempts",
            {
                "fields": (
                    "shard",
                    "shard_key_display",
                    "key_hash_display",
                    "ordered",
                    "attempts",
                    "max_attempts",
                    "status_rank",
                    "fence",
                )
            },
        ),
        (
            "Times",
            {
                "fields": (
                    "enqueued_at_display",
                    "run_after_display",
                    "started_at_display",
                    "last_attempted_at_display",
                    "finished_at_display",
                    "waited_display",
                    "ran_display",
                    "total_display",
                )
            },
        ),
    )
    readonly_fields = (
        "status_display",
        "args_display",
        "kwargs_display",
        "redaction",
        "return_value_display",
        "errors_display",
        "worker_ids_display",
        "shard_key_display",
        "key_hash_display",
        *(f"{name}_display" for name in TIMES),
        "waited_display",
        "ran_display",
        "total_display",
    )

    def get_queryset(self, request):
        # The stored values that may be large or odd are never loaded as
        # they are: arguments only up to ARGUMENTS_MAX_BYTES (as JSON
        # text), outcomes only as bounded excerpts (get_object), timestamps
        # through with_safe_times (an infinite one cannot be loaded).
        queryset = super().get_queryset(request).defer("args", "kwargs", *OUTCOME_FIELDS)
        now = ClockTimestamp()
        waiting = Q(status__in=["READY", "CLAIMED"])
        return with_safe_times(queryset, TIMES).annotate(
            args_bounded=bounded_json("args"),
            kwargs_bounded=bounded_json("kwargs"),
            # The pickup latency of the dashboard: from due (run_after) to
            # the start of the final attempt; a job not started yet, so far.
            waited_seconds=Case(
                When(waiting & Q(run_after__lte=now), then=seconds_between(F("run_after"), now)),
                When(waiting, then=None),
                default=seconds_between(F("run_after"), Coalesce(F("last_attempted_at"), F("finished_at"))),
            ),
            # The final attempt's run: from its start to the outcome; a
            # running job, so far.
            ran_seconds=Case(
                When(
                    status__in=["SUCCESSFUL", "FAILED"], then=seconds_between(F("last_attempted_at"), F("finished_at"))
                ),
                When(status="RUNNING", then=seconds_between(F("last_attempted_at"), now)),
                default=None,
            ),
            total_seconds=seconds_between(F("enqueued_at"), F("finished_at")),
        )

    def get_object(self, request, object_id, from_field=None):
        """The job of the change page, with its outcome as bounded excerpts."""
        queryset = self.get_queryset(request).annotate(
            return_value_excerpt=json_excerpt("return_value"),
            worker_ids_excerpt=json_excerpt("worker_ids"),
            errors_excerpt=errors_excerpt(),
        )
        field = Job._meta.pk if from_field is None else Job._meta.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (Job.DoesNotExist, ValidationError, ValueError):
            return None

    def lookup_allowed(self, lookup, value, request=None):
        """No URL filter on what the admin hides or bounds: a lookup such as
        ``?kwargs__password__startswith=a`` would tell a sensitive value
        one guess at a time. Refused lookups are Django's
        DisallowedModelAdminLookup (400)."""
        if lookup.split(LOOKUP_SEP, 1)[0] in UNFILTERABLE_FIELDS:
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        """Job id, part of a task path, or an exact shard key — the key only
        of jobs whose key is shown (a registered task whose key is not
        sensitive): a match would confirm a guessed hidden value."""
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            found = found | queryset.filter(shard_key=term, task_path__in=shown_key_task_paths())
        return found, may_have_duplicates

    def has_add_permission(self, request):
        return False  # jobs come from enqueue

    def has_change_permission(self, request, obj=None):
        return False  # a job row is the worker runtime's; the actions below are the only writes

    def has_delete_permission(self, request, obj=None):
        return False  # Discard (FAILED jobs only) is the one way to delete

    def has_retry_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.retry_job")

    def has_discard_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.discard_job")

    # -- columns and fields --

    @admin.display(description="status", ordering="status")
    def status_display(self, obj):
        if is_dead_lettered(obj):
            return format_html(
                '<span class="shardq-badge shardq-dead" data-status="{}">{}</span>', "FAILED", "FAILED · dead-letter"
            )
        return format_html(
            '<span class="shardq-badge shardq-{}" data-status="{}">{}</span>',
            obj.status.lower(),
            obj.status,
            obj.status,
        )

    enqueued_at_display = time_column("enqueued_at", "enqueued at")
    run_after_display = time_column("run_after", "run after")
    started_at_display = time_column("started_at", "started at")
    last_attempted_at_display = time_column("last_attempted_at", "last attempted at")
    finished_at_display = time_column("finished_at", "finished at")

    @admin.display(description="waited")
    def waited_display(self, obj):
        """How long it waited once due for its final attempt to start (so far, when it has not started)."""
        if obj.waited_seconds is None:
            return "—"
        if obj.status in ("READY", "CLAIMED"):
            return format_html(
                '{}<span class="shardq-so-far" title="not started yet: so far">…</span>',
                seconds_html(obj.waited_seconds),
            )
        return seconds_html(obj.waited_seconds)

    @admin.display(description="ran")
    def ran_display(self, obj):
        """How long its final attempt ran (so far, while it runs)."""
        if obj.ran_seconds is None:
            return "—"
        if obj.status == "RUNNING":
            return format_html(
                '{}<span class="shardq-so-far" title="running: so far">…</span>', seconds_html(obj.ran_seconds)
            )
        return seconds_html(obj.ran_seconds)

    @admin.display(description="enqueued → finished")
    def total_display(self, obj):
        return seconds_html(obj.total_seconds)

    @admin.display(description="attempts")
    def attempts_display(self, obj):
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="shard key")
    def shard_key_display(self, obj):
        if obj.shard_key is None:
            return "—"
        if shard_key_is_sensitive(task_of(obj.task_path)):
            return REDACTED
        return truncate(obj.shard_key, 60)

    @admin.display(description="key hash")
    def key_hash_display(self, obj):
        # The 32-bit hash of a sensitive key would let a guess be checked.
        if obj.shard_key is not None and shard_key_is_sensitive(task_of(obj.task_path)):
            return REDACTED
        return obj.key_hash

    def _shown_arguments(self, obj):
        """(args, kwargs) redacted, or None when they are too large to load."""
        args, kwargs = obj.args_bounded, obj.kwargs_bounded
        if not isinstance(args, dict) or not isinstance(kwargs, dict):
            return None
        if args.get("bytes", 0) > ARGUMENTS_MAX_BYTES or kwargs.get("bytes", 0) > ARGUMENTS_MAX_BYTES:
            return None
        return redact_arguments(task_of(obj.task_path), args.get("value"), kwargs.get("value"))

    def _too_large(self, obj) -> str:
        sizes = [(obj.args_bounded or {}).get("bytes"), (obj.kwargs_bounded or {}).get("bytes")]
        return (
            f"(arguments too large to show: {sizes[0]} bytes of args, {sizes[1]} bytes of kwargs; "
            f"at most {ARGUMENTS_MAX_BYTES} bytes each are shown)"
        )

    @admin.display(description="arguments")
    def arguments_display(self, obj):
        shown = self._shown_arguments(obj)
        if shown is None:
            return self._too_large(obj)
        args, kwargs = shown
        parts = []
        parts += [short_json(a) for a in args] if isinstance(args, list) else [short_json(args)]
        if isinstance(kwargs, dict):
            parts += [f"{k}={short_json(v)}" for k, v in kwargs.items()]
        else:
            parts.append(short_json(kwargs))
        return format_html('<code class="shardq-args">{}</code>', truncate(", ".join(parts)))

    @admin.display(description="args")
    def args_display(self, obj):
        shown = self._shown_arguments(obj)
        return self._too_large(obj) if shown is None else _pre(excerpt(pretty_json(shown[0])))

    @admin.display(description="kwargs")
    def kwargs_display(self, obj):
        shown = self._shown_arguments(obj)
        return self._too_large(obj) if shown is None else _pre(excerpt(pretty_json(shown[1])))

    @admin.display(description="redaction")
    def redaction(self, obj):
        task = task_of(obj.task_path)
        if task is None:
            return (
                f"The task {obj.task_path} is not defined in this process, so which arguments "
                "are sensitive is unknown: every argument is hidden."
            )
        marked = getattr(task, "sensitive", ())
        if marked is True:
            return "Every argument is marked sensitive (sensitive=True)."
        if marked:
            return "Marked sensitive: " + ", ".join(marked) + "."
        return "No argument is marked sensitive."

    @admin.display(description="return value")
    def return_value_display(self, obj):
        shown = getattr(obj, "return_value_excerpt", None)
        if shown is None:  # SQL NULL: no return value (yet)
            return "—"
        return _pre(excerpt_of_json(shown))

    @admin.display(description="errors (oldest first)")
    def errors_display(self, obj):
        shown = getattr(obj, "errors_excerpt", None) or {}
        errors, count = shown.get("errors") or [], shown.get("count") or 0
        if not errors:
            return "none"
        items = []
        for error in errors:
            if "raw" in error:  # not an object: the raw JSON
                path, text = "?", excerpt(error["raw"] or "", error.get("raw_bytes"))
            else:
                path = truncate(str(error.get("exception_class_path") or "?"), 300)
                text = excerpt(error.get("traceback") or "", error.get("traceback_bytes"))
            items.append((error.get("n"), path, text))
        html = format_html_join(
            "",
            '<div class="shardq-error"><strong>#{} {}</strong><pre class="shardq-pre shardq-traceback">{}</pre></div>',
            items,
        )
        if count > len(errors):
            html = format_html(
                "{}<p>{} errors in all: the oldest and the newest {} are shown.</p>", html, count, ERRORS_SHOWN_EACH_END
            )
        return html

    @admin.display(description="worker ids (one per attempt)")
    def worker_ids_display(self, obj):
        shown = getattr(obj, "worker_ids_excerpt", None)
        if not shown:
            return "none"
        ids = parsed_excerpt(shown)
        if ids is NOT_PARSED or not isinstance(ids, list):
            return _pre(excerpt_of_json(shown))  # an odd row: the raw value, bounded
        if not ids:
            return "none"
        return format_html_join(", ", "{}", ((worker_link_bare(w),) for w in ids))

    # -- dead-letter actions --

    @admin.action(
        description="Retry selected FAILED jobs (READY now, fresh attempts)",
        permissions=["retry"],
        location=BOTH_LOCATIONS,
    )
    def retry_failed(self, request, queryset):
        if not self.has_retry_permission(request):  # the action list already hides it
            raise PermissionDenied
        ids, requested = self._selection(request, queryset)
        config = get_config()
        done = []
        if ids:
            with transaction.atomic():
                # One compare-and-set UPDATE (status = 'FAILED'); workers are
                # woken through the shard's NOTIFY when this commits.
                rows = operations.run(
                    "admin_retry_failed_jobs", {"ids": ids, "notify": config.notify, "channel": config.channel}
                )
                done = [(row[0], row[1]) for row in rows]
                self._log(request, done, CHANGE, "Retried from the admin: READY with a fresh attempt budget.")
        self._report(request, "Retried", "now READY with a fresh attempt budget", requested, done)

    @admin.action(
        description="Discard (delete) selected FAILED jobs",
        permissions=["discard"],
        location=BOTH_LOCATIONS,
    )
    def discard_failed(self, request, queryset):
        if not self.has_discard_permission(request):
            raise PermissionDenied
        ids, requested = self._selection(request, queryset)
        done = []
        if ids:
            with transaction.atomic():
                # One compare-and-set DELETE (status = 'FAILED').
                done = [(row[0], row[1]) for row in operations.run("admin_discard_failed_jobs", {"ids": ids})]
                self._log(request, done, DELETION, "Discarded from the admin.")
        self._report(request, "Discarded", "deleted", requested, done)
        match = request.resolver_match
        if done and match is not None and match.url_name == "shardq_job_change":
            # Run from the job's own page, which is gone now: back to the list.
            return HttpResponseRedirect(reverse("admin:shardq_job_changelist"))

    @staticmethod
    def _selection(request, queryset) -> tuple[list[int], set[int]]:
        """The ids to act on (the selection within the page's filters, as
        Django hands it over) and the ids the operator asked for: a job
        ticked while FAILED may have left the filtered list by now (another
        operator retried it), and is reported as skipped rather than
        silently dropped."""
        ids = list(queryset.values_list("id", flat=True))
        requested = set(ids)
        if request.POST.get("select_across") != "1":
            requested.update(int(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if v.isdigit())
        return ids, requested

    def _log(self, request, rows, flag, message):
        """One admin history entry a job written (in the action's transaction)."""
        if not rows:
            return
        content_type = ContentType.objects.get_for_model(Job)
        LogEntry.objects.bulk_create(
            LogEntry(
                user_id=request.user.pk,
                content_type_id=content_type.pk,
                object_id=str(job_id),
                object_repr=f"{task_path}#{job_id}"[:200],
                action_flag=flag,
                change_message=message,
            )
            for job_id, task_path in rows
        )

    def _report(self, request, verb, outcome, selected, done):
        done_ids = {job_id for job_id, _ in done}
        skipped = sorted(set(selected) - done_ids)
        if done_ids:
            noun = "job" if len(done_ids) == 1 else "jobs"
            self.message_user(request, f"{verb} {len(done_ids)} {noun}: {outcome}.", messages.SUCCESS)
        if skipped:
            shown = ", ".join(f"#{i}" for i in skipped[:20]) + (" …" if len(skipped) > 20 else "")
            noun = "job" if len(skipped) == 1 else "jobs"
            self.message_user(
                request,
                f"Skipped {len(skipped)} {noun} not FAILED (any more): {shown}. Only FAILED jobs "
                "can be retried or discarded; a job that changed meanwhile is left as it is.",
                messages.WARNING,
            )


# -- shard events ------------------------------------------------------------


@admin.register(ShardEvent)
class ShardEventAdmin(ShardqModelAdmin):
    """Ownership history: every claim, takeover and release of a shard."""

    list_display = ("at_display", "shard", "reason", "claim_version", "worker_display", "rescued")
    fields = ("at_display", "shard", "reason", "claim_version", "worker_display", "rescued")
    readonly_fields = fields
    list_filter = ("reason",)
    search_fields = ("=shard", "=worker")
    ordering = ("-at",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return with_safe_times(super().get_queryset(request), ("at",))

    at_display = time_column("at", "at")

    @admin.display(description="worker", ordering="worker")
    def worker_display(self, obj):
        url = reverse("admin:shardq_worker_change", args=[obj.worker])
        return format_html('<a href="{}" class="shardq-id">{}</a>', url, obj.worker)


# -- dashboard ---------------------------------------------------------------

DEFAULT_WINDOW_MINUTES = 15
MAX_WINDOW_MINUTES = 7 * 24 * 60
# A shard is hot when one of its figures is over FACTOR x the median shard's
# plus a floor (the floor keeps near-zero medians from flagging noise).
HOT_FACTOR = 2.0
HOT_DEPTH_FLOOR = 10
HOT_WAIT_FLOOR_SECONDS = 5.0
HOT_P99_FLOOR_SECONDS = 0.25
# p99 of fewer jobs than this is noise: such shards are not judged on it.
HOT_P99_MIN_JOBS = 10

HOT_RULE = (
    f"A shard is hot when its READY depth is over {HOT_FACTOR:g} × the median shard's + "
    f"{HOT_DEPTH_FLOOR}, its oldest due READY job has waited over {HOT_FACTOR:g} × the median "
    f"shard's + {HOT_WAIT_FLOOR_SECONDS:g} s, or its p99 pickup latency is over {HOT_FACTOR:g} × "
    f"the median shard's p99 + {HOT_P99_FLOOR_SECONDS:g} s. Medians are over all shards (a shard "
    f"with no due READY job waits 0 s); p99 is judged only for shards that finished at least "
    f"{HOT_P99_MIN_JOBS} jobs in the window, and its median is over those shards."
)

DASHBOARD_COLUMNS = (
    "shard",
    "owner",
    "host",
    "pid",
    "lease_left",
    "finished",
    "failed",
    "dead",
    "p50",
    "p99",
    "mean",
    "max",
    "depth",
    "due",
    "oldest",
    "running",
)


def parse_minutes(raw: str | None) -> tuple[int, str | None]:
    """The window in minutes from the ``minutes`` GET parameter, and an error to show."""
    if raw in (None, ""):
        return DEFAULT_WINDOW_MINUTES, None
    try:
        minutes = int(raw)
    except ValueError:
        minutes = 0
    if not 1 <= minutes <= MAX_WINDOW_MINUTES:
        return DEFAULT_WINDOW_MINUTES, (
            f"minutes={raw!r} is not a whole number of minutes from 1 to {MAX_WINDOW_MINUTES} "
            f"(a week): showing the last {DEFAULT_WINDOW_MINUTES} minutes."
        )
    return minutes, None


def dashboard_data(minutes: int) -> dict:
    """Per-shard figures and totals over the last ``minutes``, with hot shards marked."""
    rows = [
        dict(zip(DASHBOARD_COLUMNS, row, strict=True))
        for row in operations.run("admin_dashboard", {"minutes": minutes})
    ]
    shards = [r for r in rows if r["shard"] is not None]
    total = next((r for r in rows if r["shard"] is None), None) or dict.fromkeys(DASHBOARD_COLUMNS)

    median_depth = statistics.median([r["depth"] for r in shards]) if shards else 0
    median_wait = statistics.median([r["oldest"] or 0.0 for r in shards]) if shards else 0.0
    judged = [r for r in shards if r["finished"] >= HOT_P99_MIN_JOBS and r["p99"] is not None]
    median_p99 = statistics.median([r["p99"] for r in judged]) if judged else None
    for r in shards:
        reasons = []
        if r["depth"] > HOT_FACTOR * median_depth + HOT_DEPTH_FLOOR:
            reasons.append(f"READY depth {r['depth']} > {HOT_FACTOR:g} × {median_depth:g} + {HOT_DEPTH_FLOOR}")
        wait = r["oldest"] or 0.0
        if wait > HOT_FACTOR * median_wait + HOT_WAIT_FLOOR_SECONDS:
            reasons.append(
                f"oldest READY waits {human_seconds(wait)} > {HOT_FACTOR:g} × "
                f"{human_seconds(median_wait)} + {HOT_WAIT_FLOOR_SECONDS:g} s"
            )
        if median_p99 is not None and r in judged and r["p99"] > HOT_FACTOR * median_p99 + HOT_P99_FLOOR_SECONDS:
            reasons.append(
                f"p99 {human_seconds(r['p99'])} > {HOT_FACTOR:g} × {human_seconds(median_p99)} "
                f"+ {HOT_P99_FLOOR_SECONDS:g} s"
            )
        r["hot_reasons"] = reasons
        r["throughput"] = r["finished"] / minutes
        held = r["owner"] is not None and r["lease_left"] is not None and r["lease_left"] > 0
        r["owner_state"] = "held" if held else ("expired" if r["owner"] is not None else "none")
        for key in ("p50", "p99", "mean", "max", "oldest", "lease_left"):
            r[key + "_text"] = human_seconds(r[key])

    total["throughput"] = (total["finished"] or 0) / minutes
    total["depth"] = sum(r["depth"] for r in shards)
    total["due"] = sum(r["due"] for r in shards)
    total["running"] = sum(r["running"] for r in shards)
    waits = [r["oldest"] for r in shards if r["oldest"] is not None]
    total["oldest"] = max(waits) if waits else None
    for key in ("p50", "p99", "mean", "max", "oldest"):
        total[key + "_text"] = human_seconds(total[key])
    return {
        "shards": shards,
        "total": total,
        "hot": [r for r in shards if r["hot_reasons"]],
        "unowned_waiting": [r for r in shards if r["owner_state"] != "held" and r["depth"]],
        "median_depth": median_depth,
        "median_wait_text": human_seconds(median_wait),
        "median_p99_text": human_seconds(median_p99),
        "charts": shard_charts(shards),
    }


def shard_charts(shards: list[dict]) -> list[dict]:
    """READY depth and p99 pickup latency by shard, hot shards in red."""
    labels = [str(r["shard"]) for r in shards]
    ticks_at = [i for i, r in enumerate(shards) if r["shard"] % 8 == 0]
    hot = [bool(r["hot_reasons"]) for r in shards]
    return [
        {
            **charts.bar_chart(
                "READY depth by shard (now)",
                "READY jobs",
                "shard",
                labels,
                [charts.Series("READY", "bar", [r["depth"] for r in shards])],
                ticks_at=ticks_at,
                fmt=lambda v: f"{v:g}",
                hot=hot,
                whole=True,
            ),
            "key": "depth-by-shard",
        },
        {
            **charts.bar_chart(
                "p99 pickup latency by shard (the window)",
                "p99 pickup",
                "shard",
                labels,
                [charts.Series("p99", "bar", [r["p99"] for r in shards])],
                ticks_at=ticks_at,
                fmt=human_seconds,
                hot=hot,
            ),
            "key": "p99-by-shard",
        },
    ]


# The time-series charts cover the last hour, a point a minute.
CHART_MINUTES = 60
TIMESERIES_COLUMNS = ("minute", "successful", "failed", "p50", "p99", "waiting", "oldest")


def timeseries_data(minutes: int = CHART_MINUTES) -> dict:
    """The last ``minutes``, a row a minute (``admin_timeseries``), and their charts."""
    rows = [
        dict(zip(TIMESERIES_COLUMNS, row, strict=True))
        for row in operations.run("admin_timeseries", {"minutes": minutes})
    ]
    local = [timezone.localtime(r["minute"]) for r in rows]
    labels = [format_date(m, "H:i") for m in local]
    ticks_at = [i for i, m in enumerate(local) if m.minute % 10 == 0]
    time_title = f"time ({timezone.get_current_timezone_name()}), a point a minute; the last minute so far"
    column = {key: [r[key] for r in rows] for key in TIMESERIES_COLUMNS}

    def chart(key, build, *args, **kwargs):
        return {**build(*args, ticks_at=ticks_at, **kwargs), "key": key}

    return {
        "rows": rows,
        "charts": [
            chart(
                "finished",
                charts.bar_chart,
                "Jobs finished a minute, by status",
                "jobs / min",
                time_title,
                labels,
                [
                    charts.Series("SUCCESSFUL", "successful", column["successful"]),
                    charts.Series("FAILED", "failed", column["failed"]),
                ],
                fmt=lambda v: f"{v:g}",
                whole=True,
            ),
            chart(
                "pickup",
                charts.line_chart,
                "Pickup latency (due → final start) of the jobs finished each minute",
                "seconds",
                time_title,
                labels,
                [charts.Series("p50", "p50", column["p50"]), charts.Series("p99", "p99", column["p99"])],
                fmt=human_seconds,
            ),
            chart(
                "waiting",
                charts.line_chart,
                "Due jobs waiting for their start (READY depth), at each minute's end",
                "jobs",
                time_title,
                labels,
                [charts.Series("due, waiting", "waiting", column["waiting"])],
                fmt=lambda v: f"{v:g}",
                whole=True,
            ),
            chart(
                "oldest",
                charts.line_chart,
                "Oldest due job's wait (oldest READY age), at each minute's end",
                "seconds",
                time_title,
                labels,
                [charts.Series("oldest wait", "oldest", column["oldest"])],
                fmt=human_seconds,
            ),
        ],
    }


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):  # not a list: no ShardqModelAdmin
    """The dashboard page: a proxy model's admin whose only URL is its changelist."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("", self.admin_site.admin_view(self.dashboard_view), name="{}_{}_changelist".format(*info))]

    def dashboard_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        minutes, error = parse_minutes(request.GET.get("minutes"))
        context = {
            **self.admin_site.each_context(request),
            **dashboard_data(minutes),
            "timeseries": timeseries_data(),
            "chart_minutes": CHART_MINUTES,
            "title": "shardq dashboard",
            "opts": self.opts,
            "minutes": minutes,
            "minutes_error": error,
            "hot_rule": HOT_RULE,
            "shard_url": reverse("admin:shardq_shard_changelist"),
            "job_url": reverse("admin:shardq_job_changelist"),
            "worker_url": reverse("admin:shardq_worker_changelist"),
            "lease_ttl": get_config().lease_ttl_seconds,
        }
        return TemplateResponse(request, "admin/shardq/dashboard.html", context)


@admin.register(LimitSlot)
class LimitsAdmin(admin.ModelAdmin):  # a report, not a list of rows
    """The limits page (docs/limits.md): every concurrency and rate limit in
    use or waited on, its capacity, slots in use, who holds them, waiting
    jobs and a rate's tokens now (``shardq.limits.limit_report``; the same
    figures as ``shardq_status``). Read-only."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("", self.admin_site.admin_view(self.limits_view), name="{}_{}_changelist".format(*info))]

    def limits_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Limits",
            "opts": self.opts,
            "limits": limit_report(),
            "job_url": reverse("admin:shardq_job_changelist"),
            "lease_ttl": get_config().lease_ttl_seconds,
        }
        return TemplateResponse(request, "admin/shardq/limits.html", context)
