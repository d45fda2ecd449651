"""Workers: liveness as shardq/db/sql/worker.sql defines it, shards held, stats."""

from django.contrib import admin
from django.db.models import (
    Count,
    F,
    IntegerField,
    OuterRef,
    Subquery,
    TextField,
)
from django.db.models.expressions import Expression
from django.db.models.functions import Coalesce
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html

from ..conf import get_config
from ..db import operations
from ..models import Shard, Worker
from .common import (
    ClockTimestamp,
    SecondsSince,
    ShardqModelAdmin,
    _pre,
    breakable,
    excerpt,
    seconds_html,
    short_json,
    time_column,
    truncate,
    with_safe_times,
)

# -- workers -----------------------------------------------------------------


# worker_liveness's values (shardq/db/sql/worker.sql), and what each means.
LIVENESS = {
    "live": "RUNNING, heartbeat within LEASE_TTL ({ttl:g} s)",
    "stopping": "draining after a signal, heartbeat within LEASE_TTL ({ttl:g} s)",
    "dead": "no heartbeat for longer than LEASE_TTL ({ttl:g} s): its shards expire and are taken over",
    "stopped": "stopped gracefully",
}


def worker_liveness(ttl: float) -> Expression:
    """worker_liveness of shardq/db/sql/worker.sql, the definition shardq_status uses too."""
    return operations.expression("worker_liveness", {"ttl": ttl}, TextField())


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
    in shardq/db/sql/worker.sql, which shardq_status reads too)."""

    list_display = (
        "host_display",
        "pid",
        "liveness_display",
        "state",
        "shards_held_display",
        "heartbeat_age_display",
        "pool_display",
        "started_at_display",
        "counters_short",
        "id",
    )
    list_display_links = ("host_display",)
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
            # worker_liveness: live = RUNNING with a heartbeat within LEASE_TTL.
            liveness=worker_liveness(ttl),
        )

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

    @admin.display(description="host", ordering="host")
    def host_display(self, obj):
        return breakable(obj.host)

    @admin.display(description="pool", ordering="pool")
    def pool_display(self, obj):
        return breakable(obj.pool)

    @admin.display(description="counters")
    def counters_short(self, obj):
        if not isinstance(obj.stats, dict):  # an odd row: the raw value
            return truncate(short_json(obj.stats), 160) if obj.stats is not None else "—"
        text = ", ".join(f"{k}={short_json(v)}" for k, v in sorted(obj.stats.items()) if v)
        return breakable(truncate(text, 160)) if text else "—"

    @admin.display(description="counters")
    def counters_table(self, obj):
        stats = obj.stats
        if not isinstance(stats, dict):  # an odd row: the raw value, bounded
            return _pre(excerpt(short_json(stats)))
        if not stats:
            return "none yet (written at every heartbeat)"
        counters = [(truncate(k, 200), truncate(short_json(v), 200)) for k, v in sorted(stats.items())[:500]]
        return render_to_string("admin/shardq/fragments/worker_counters.html", {"counters": counters})

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
