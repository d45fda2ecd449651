"""The dashboard: per-shard figures over a window, hot shards, and the
last hour's charts."""

import statistics

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateformat import format as format_date

from .. import charts
from ..conf import get_config
from ..db import operations
from ..fairness import fair_key_report
from ..models import Dashboard
from .common import (
    ReadOnlyMixin,
    human_seconds,
)

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


def mark_hot_shards(shards: list[dict]) -> tuple[float, float, float | None]:
    """Apply HOT_RULE: set each shard row's ``hot_reasons`` (a list of the
    figures over the rule, empty when the shard is not hot) from its
    ``depth``, ``oldest`` (seconds the oldest due READY job waited, None for
    none), ``finished`` and ``p99``. Returns the medians it compared with:
    depth, wait and p99 (None when no shard finished enough jobs to judge)."""
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
    return median_depth, median_wait, median_p99


def dashboard_data(minutes: int) -> dict:
    """Per-shard figures and totals over the last ``minutes``, with hot shards marked."""
    rows = [
        dict(zip(DASHBOARD_COLUMNS, row, strict=True))
        for row in operations.run("admin_dashboard", {"minutes": minutes})
    ]
    shards = [r for r in rows if r["shard"] is not None]
    total = next((r for r in rows if r["shard"] is None), None) or dict.fromkeys(DASHBOARD_COLUMNS)

    median_depth, median_wait, median_p99 = mark_hot_shards(shards)
    for r in shards:
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


def fair_keys_data() -> list[dict]:
    """Each queue's top fair keys (docs/fairness.md): ``shardq_status``'s
    figures, with the oldest wait as text."""
    report = fair_key_report()
    for queue in report:
        for key in queue["keys"]:
            key["oldest_text"] = human_seconds(key["oldest_seconds"])
    return report


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
class DashboardAdmin(ReadOnlyMixin, admin.ModelAdmin):  # not a list: no ShardqModelAdmin
    """The dashboard page: a proxy model's admin whose only URL is its changelist."""

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
            "fair_keys": fair_keys_data(),
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
