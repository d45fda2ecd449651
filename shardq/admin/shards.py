"""The shard map (one row per pool and shard, owner and lease) and the
ownership history of shard events."""

import math

from django.contrib import admin
from django.db.models import (
    Count,
    F,
    IntegerField,
    Min,
    OuterRef,
    Subquery,
)
from django.db.models.functions import Coalesce
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from ..models import Job, Shard, ShardEvent, Worker
from .common import (
    ClockTimestamp,
    SecondsSince,
    SecondsUntil,
    ShardqModelAdmin,
    breakable,
    seconds_html,
    show_time,
    time_column,
    truncate,
    with_safe_times,
)

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
        breakable(host),
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
        "pool_display",
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

    claimed_at_display = time_column("claimed_at", "claimed at")

    @admin.display(description="owner", ordering="owner")
    @admin.display(description="pool", ordering="pool")
    def pool_display(self, obj):
        return breakable(obj.pool)

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
        rows = [(show_time(e.at_finite, e.at_infinite), e.reason, e.claim_version, e.worker, e.rescued) for e in events]
        if not rows:
            return "none"
        return render_to_string("admin/shardq/fragments/shard_events.html", {"events": rows})


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

    def get_queryset(self, request):
        return with_safe_times(super().get_queryset(request), ("at",))

    at_display = time_column("at", "at")

    @admin.display(description="worker", ordering="worker")
    def worker_display(self, obj):
        url = reverse("admin:shardq_worker_change", args=[obj.worker])
        return format_html('<a href="{}" class="shardq-id">{}</a>', url, obj.worker)
