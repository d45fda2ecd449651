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
import statistics
from functools import cache, lru_cache

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import Case, Count, F, FloatField, Func, IntegerField, Min, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from .conf import get_config
from .db.queries import QUERIES
from .exceptions import UnknownTask
from .models import Dashboard, Job, Shard, ShardEvent, Worker
from .tasks import REDACTED, autodiscover, redact_arguments, resolve, shard_key_is_sensitive

# -- database-clock expressions ---------------------------------------------


class ClockTimestamp(Func):
    """``clock_timestamp()``: the database's clock, as the lease protocol reads it."""

    template = "clock_timestamp()"
    arity = 0


class SecondsUntil(Func):
    """Seconds from the database's clock to a timestamp (negative: past)."""

    template = "extract(epoch FROM %(expressions)s - clock_timestamp())::float8"
    arity = 1
    output_field = FloatField()


class SecondsSince(Func):
    """Seconds from a timestamp to the database's clock."""

    template = "extract(epoch FROM clock_timestamp() - %(expressions)s)::float8"
    arity = 1
    output_field = FloatField()


# -- formatting --------------------------------------------------------------


def human_seconds(value: float | None) -> str:
    """A duration for people: ms below a second, then s, min, h."""
    if value is None:
        return "—"
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
    return format_html('<span data-seconds="{}">{}</span>', f"{value:.6f}", human_seconds(value))


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def short_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def truncate(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pre(text: str):
    return format_html('<pre class="shardq-pre">{}</pre>', text)


# -- tasks, as this process knows them ---------------------------------------


@lru_cache(maxsize=1024)
def task_of(task_path: str):
    """The Task a job names, or None when this process cannot resolve it (its
    arguments are then all hidden: their sensitivity is unknown). Cached: a
    page asks for every row, and a failed import is not cached by Python."""
    try:
        return resolve(task_path, get_config().task_modules)
    except UnknownTask:
        return None


@cache
def known_task_paths() -> tuple[str, ...]:
    """Task paths defined in this process (installed apps' ``tasks`` modules
    and ``SHARDQ["TASK_MODULES"]``): the task filter's choices, found without
    scanning ``shardq_job``."""
    from .tasks import registered_task_paths

    autodiscover(get_config().task_modules)
    return tuple(sorted(registered_task_paths()))


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
    if worker_id is None:
        return "—"
    url = reverse("admin:shardq_worker_change", args=[worker_id])
    if host is None:  # the worker's row is gone (pruned)
        return format_html('<a href="{}" class="shardq-id">{}</a>', url, worker_id)
    return format_html(
        '<a href="{}">{}:{}</a> <span class="shardq-id" title="{}" data-worker-id="{}">{}</span>',
        url, host, pid, worker_id, worker_id, str(worker_id)[:8],
    )


@admin.register(Shard)
class ShardAdmin(admin.ModelAdmin):
    """The shard map: one row a shard, with its lease and its READY backlog."""

    list_display = (
        "shard",
        "owner_display",
        "lease_left_display",
        "claim_version",
        "ready_depth_display",
        "oldest_ready_display",
        "claimed_at",
    )
    list_display_links = ("shard",)
    list_filter = (LeaseFilter,)
    ordering = ("shard",)
    # Every shard on one page (SHARD_COUNT is a power of two, 64 by default).
    list_per_page = 1024
    list_max_show_all = 4096
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "shard",
        "owner_display",
        "lease_left_display",
        "claim_version",
        "claimed_at",
        "ready_depth_display",
        "oldest_ready_display",
        "jobs_link",
        "recent_events",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ["shardq/admin.css"]}

    def get_queryset(self, request):
        # Two correlated subqueries a shard, each an index range walk over
        # that shard's slice of shardq_job_ready_idx (shard, ...) WHERE
        # status = 'READY': no scan of the rest of the table.
        ready = Job.objects.filter(shard=OuterRef("shard"), status="READY").order_by().values("shard")
        depth = ready.annotate(n=Count("*")).values("n")
        oldest_due = (
            ready.filter(run_after__lte=ClockTimestamp()).annotate(at=Min("run_after")).values("at")
        )
        owner = Worker.objects.filter(id=OuterRef("owner"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                ready_depth=Coalesce(Subquery(depth, output_field=IntegerField()), 0),
                oldest_ready_seconds=SecondsSince(Subquery(oldest_due)),
                lease_left_seconds=SecondsUntil(F("lease_expires")),
                owner_host=Subquery(owner.values("host")[:1]),
                owner_pid=Subquery(owner.values("pid")[:1]),
            )
        )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # ownership is the lease protocol's

    def has_delete_permission(self, request, obj=None):
        return False  # rows are never deleted: claim_version must never be reused

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
        if left <= 0:
            return format_html('expired {} ago', seconds_html(-left))
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
            url, obj.shard, url, obj.shard, obj.shard,
        )

    @admin.display(description="recent ownership events")
    def recent_events(self, obj):
        events = ShardEvent.objects.filter(shard=obj.shard).order_by("-at")[:20]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((e.at, e.reason, e.claim_version, e.worker, e.rescued) for e in events),
        )
        if not rows:
            return "none"
        return format_html(
            '<table class="shardq-table"><thead><tr><th>at</th><th>reason</th><th>claim version</th>'
            "<th>worker</th><th>jobs rescued</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )


# -- workers -----------------------------------------------------------------


class LivenessFilter(admin.SimpleListFilter):
    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("dead", "dead"), ("stopped", "stopped")]

    def queryset(self, request, queryset):
        if self.value() in ("live", "dead", "stopped"):
            return queryset.filter(liveness=self.value())
        return queryset


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    """Worker incarnations: live (heartbeat within LEASE_TTL), dead (silent
    longer than that: its shards expire and are taken over) or stopped."""

    list_display = (
        "host",
        "pid",
        "liveness_display",
        "state",
        "shards_held_display",
        "heartbeat_age_display",
        "queues_display",
        "started_at",
        "counters_short",
        "id",
    )
    list_display_links = ("host",)
    list_filter = (LivenessFilter, "state")
    search_fields = ("=id", "host")
    ordering = ("-started_at",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "id",
        "host",
        "pid",
        "liveness_display",
        "state",
        "started_at",
        "heartbeat_at",
        "heartbeat_age_display",
        "queues_display",
        "shards_display",
        "counters_table",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ["shardq/admin.css"]}

    def get_queryset(self, request):
        ttl = get_config().lease_ttl_seconds
        held = (
            Shard.objects.filter(owner=OuterRef("id"), lease_expires__gt=ClockTimestamp())
            .order_by()
            .values("owner")
            .annotate(n=Count("*"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                heartbeat_age_seconds=SecondsSince(F("heartbeat_at")),
                shards_held=Coalesce(Subquery(held, output_field=IntegerField()), 0),
            )
            .annotate(
                # The lease protocol's rule (DESIGN §4): live = heartbeat
                # within LEASE_TTL. A stopped worker said goodbye.
                liveness=Case(
                    When(state=Worker.State.STOPPED, then=Value("stopped")),
                    When(heartbeat_age_seconds__lte=ttl, then=Value("live")),
                    default=Value("dead"),
                )
            )
        )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # `manage.py shardq_prune` removes old incarnations

    @admin.display(description="liveness", ordering="liveness")
    def liveness_display(self, obj):
        ttl = get_config().lease_ttl_seconds
        title = {
            "live": f"heartbeat within LEASE_TTL ({ttl:g} s)",
            "dead": f"no heartbeat for longer than LEASE_TTL ({ttl:g} s): its shards expire",
            "stopped": "stopped gracefully",
        }[obj.liveness]
        return format_html(
            '<span class="shardq-badge shardq-{}" data-liveness="{}" title="{}">{}</span>',
            obj.liveness, obj.liveness, title, obj.liveness,
        )

    @admin.display(description="shards held", ordering="shards_held")
    def shards_held_display(self, obj):
        return format_html('<span data-shards-held="{}">{}</span>', obj.shards_held, obj.shards_held)

    @admin.display(description="heartbeat age", ordering="-heartbeat_at")
    def heartbeat_age_display(self, obj):
        return seconds_html(obj.heartbeat_age_seconds)

    @admin.display(description="queues")
    def queues_display(self, obj):
        return ", ".join(obj.queues) if obj.queues else "all"

    @admin.display(description="counters")
    def counters_short(self, obj):
        stats = obj.stats if isinstance(obj.stats, dict) else {}
        text = ", ".join(f"{k}={v}" for k, v in sorted(stats.items()) if v)
        return truncate(text, 160) or "—"

    @admin.display(description="counters")
    def counters_table(self, obj):
        stats = obj.stats if isinstance(obj.stats, dict) else {}
        if not stats:
            return "none yet (written at every heartbeat)"
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", sorted(stats.items()))
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


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
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
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("status", DeadLetterFilter, QueueFilter, TaskPathFilter)
    search_fields = ("=id", "task_path", "=shard_key")
    search_help_text = "A job id, part of a task path, or an exact shard key."
    ordering = ("-id",)
    # The exact count of a large job table is a full scan; one count a page is enough.
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_failed", "discard_failed"]
    fieldsets = (
        (None, {"fields": ("id", "task_path", "status_display", "queue_name", "priority", "backend")}),
        ("Arguments", {"fields": ("args_display", "kwargs_display", "redaction")}),
        ("Outcome", {"fields": ("return_value_display", "errors_display", "worker_ids_display")}),
        (
            "Shard and attempts",
            {"fields": ("shard", "shard_key_display", "key_hash", "ordered", "attempts", "max_attempts",
                        "status_rank", "fence")},
        ),
        ("Times", {"fields": ("enqueued_at", "run_after", "started_at", "last_attempted_at", "finished_at")}),
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
    )

    class Media:
        css = {"all": ["shardq/admin.css"]}

    def get_queryset(self, request):
        # The list never shows outcomes; the detail page loads them on use.
        return super().get_queryset(request).defer("return_value", "errors", "worker_ids")

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
            return format_html('<span class="shardq-badge shardq-dead" data-status="{}">{}</span>',
                               "FAILED", "FAILED · dead-letter")
        return format_html('<span class="shardq-badge shardq-{}" data-status="{}">{}</span>',
                           obj.status.lower(), obj.status, obj.status)

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

    def _shown_arguments(self, obj):
        return redact_arguments(task_of(obj.task_path), obj.args, obj.kwargs)

    @admin.display(description="arguments")
    def arguments_display(self, obj):
        args, kwargs = self._shown_arguments(obj)
        parts = []
        parts += [short_json(a) for a in args] if isinstance(args, list) else [short_json(args)]
        if isinstance(kwargs, dict):
            parts += [f"{k}={short_json(v)}" for k, v in kwargs.items()]
        else:
            parts.append(short_json(kwargs))
        return format_html('<code class="shardq-args">{}</code>', truncate(", ".join(parts)))

    @admin.display(description="args")
    def args_display(self, obj):
        return _pre(pretty_json(self._shown_arguments(obj)[0]))

    @admin.display(description="kwargs")
    def kwargs_display(self, obj):
        return _pre(pretty_json(self._shown_arguments(obj)[1]))

    @admin.display(description="redaction")
    def redaction(self, obj):
        task = task_of(obj.task_path)
        if task is None:
            return (f"The task {obj.task_path} is not defined in this process, so which arguments "
                    "are sensitive is unknown: every argument is hidden.")
        marked = getattr(task, "sensitive", ())
        if marked is True:
            return "Every argument is marked sensitive (sensitive=True)."
        if marked:
            return "Marked sensitive: " + ", ".join(marked) + "."
        return "No argument is marked sensitive."

    @admin.display(description="return value")
    def return_value_display(self, obj):
        return "—" if obj.return_value is None else _pre(pretty_json(obj.return_value))

    @admin.display(description="errors (oldest first)")
    def errors_display(self, obj):
        errors = obj.errors if isinstance(obj.errors, list) else [obj.errors]
        if not errors:
            return "none"
        items = []
        for number, error in enumerate(errors, start=1):
            if isinstance(error, dict):
                path = error.get("exception_class_path", "?")
                text = error.get("traceback", "")
            else:
                path, text = "?", pretty_json(error)
            items.append((number, path, text))
        return format_html_join(
            "",
            '<div class="shardq-error"><strong>#{} {}</strong><pre class="shardq-pre shardq-traceback">{}</pre></div>',
            items,
        )

    @admin.display(description="worker ids (one per attempt)")
    def worker_ids_display(self, obj):
        ids = obj.worker_ids if isinstance(obj.worker_ids, list) else []
        if not ids:
            return "none"
        return format_html_join(
            ", ", '<a href="{}">{}</a>',
            ((reverse("admin:shardq_worker_change", args=[w]), w) for w in ids),
        )

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
            with transaction.atomic(), connection.cursor() as cursor:
                # One compare-and-set UPDATE (status = 'FAILED'); workers are
                # woken through the shard's NOTIFY when this commits.
                cursor.execute(
                    QUERIES["admin_retry_failed_jobs"],
                    {"ids": ids, "notify": config.notify, "channel": config.channel},
                )
                done = [(row[0], row[1]) for row in cursor.fetchall()]
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
            with transaction.atomic(), connection.cursor() as cursor:
                # One compare-and-set DELETE (status = 'FAILED').
                cursor.execute(QUERIES["admin_discard_failed_jobs"], {"ids": ids})
                done = [(row[0], row[1]) for row in cursor.fetchall()]
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
            requested.update(
                int(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if v.isdigit()
            )
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
class ShardEventAdmin(admin.ModelAdmin):
    """Ownership history: every claim, takeover and release of a shard."""

    list_display = ("at", "shard", "reason", "claim_version", "worker_display", "rescued")
    list_filter = ("reason",)
    search_fields = ("=shard", "=worker")
    ordering = ("-at",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

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
    "shard", "owner", "host", "pid", "lease_left", "finished", "failed", "dead", "p50", "p99",
    "mean", "max", "depth", "due", "oldest", "running",
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
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["admin_dashboard"], {"minutes": minutes})
        rows = [dict(zip(DASHBOARD_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
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
            reasons.append(f"oldest READY waits {human_seconds(wait)} > {HOT_FACTOR:g} × "
                           f"{human_seconds(median_wait)} + {HOT_WAIT_FLOOR_SECONDS:g} s")
        if median_p99 is not None and r in judged and r["p99"] > HOT_FACTOR * median_p99 + HOT_P99_FLOOR_SECONDS:
            reasons.append(f"p99 {human_seconds(r['p99'])} > {HOT_FACTOR:g} × {human_seconds(median_p99)} "
                           f"+ {HOT_P99_FLOOR_SECONDS:g} s")
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
        "charts": [
            bar_chart("READY depth by shard", shards, "depth", str),
            bar_chart("p99 pickup latency by shard", shards, "p99", human_seconds),
        ],
    }


def bar_chart(title: str, shards: list[dict], key: str, label, height: int = 120, bar: int = 10) -> dict:
    """An inline SVG bar chart (drawn server-side: no JavaScript, no CDN)."""
    values = [r[key] or 0 for r in shards]
    top = max(values, default=0) or 1
    bars = []
    for i, r in enumerate(shards):
        h = round(height * (r[key] or 0) / top, 1)
        bars.append({
            "x": i * bar + 1, "y": round(height - h, 1), "h": h, "w": bar - 2,
            "hot": bool(r["hot_reasons"]),
            "tip": f"shard {r['shard']}: {label(r[key]) if r[key] is not None else '—'}",
        })
    return {"title": title, "bars": bars, "width": len(shards) * bar + 2, "height": height,
            "top": label(top) if any(values) else "0"}


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The dashboard page: a proxy model's admin whose only URL is its changelist."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("", self.admin_site.admin_view(self.dashboard_view), name="%s_%s_changelist" % info)]

    def dashboard_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        minutes, error = parse_minutes(request.GET.get("minutes"))
        context = {
            **self.admin_site.each_context(request),
            **dashboard_data(minutes),
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
