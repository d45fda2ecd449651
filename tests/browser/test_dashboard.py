"""The dashboard, in a real browser: per-shard throughput, READY depth and
pickup latency p50/p99 (computed by PostgreSQL's percentile_cont) that match
rows with known latencies, totals, and the hot-shard rule."""

import math
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from shardq.admin import human_seconds
from tests.browser.rows import hold_shards, make_user, register_worker, shard_of, sql
from tests.taskapp.admin_tasks import ship

pytestmark = pytest.mark.usefixtures("shards")

# Shard -> pickup latencies (seconds) of jobs that finished 5 minutes ago.
# Shards 2, 5 and 9 are alike; shard 40's p99 is far above theirs.
LATENCIES = {
    2: [0.010 * i for i in range(1, 11)],
    5: [0.012 * i for i in range(1, 11)],
    9: [0.008 * i for i in range(1, 13)],
    40: [0.050] * 9 + [3.0, 4.0],
    # Too few jobs to be judged on p99 (fewer than 10), however slow.
    50: [9.0, 9.5],
}


def percentile_cont(values, fraction):
    """PostgreSQL's percentile_cont: linear interpolation between closest ranks."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def finished_job(shard: int, latency: float, *, finished_minutes_ago: float, status="SUCCESSFUL") -> None:
    """A job the worker finished: due at run_after, claimed ``latency``
    seconds later (last_attempted_at), finished a moment after that."""
    sql(
        """
        WITH t AS (SELECT clock_timestamp() - make_interval(secs => %(ago)s * 60 + 1 + %(latency)s) AS due)
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash,
            shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs,
            return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at, finished_at)
        SELECT 'tests.taskapp.admin_tasks.ship', 'default', 'default', 0, t.due, %(shard)s, %(shard)s,
               NULL, false, %(status)s, 2, 1, 1, 1, '[1]', '{}', '1', '[]', '[]', t.due,
               t.due + make_interval(secs => %(latency)s), t.due + make_interval(secs => %(latency)s),
               t.due + make_interval(secs => %(latency)s + 1)
        FROM t
        """,
        {"shard": shard, "latency": latency, "ago": finished_minutes_ago, "status": status},
    )


def cell_seconds(locator) -> float:
    return float(locator.get_attribute("data-seconds"))


def test_dashboard_shows_pickup_latency_percentiles_depth_and_hot_shards(open_admin, viewer):
    for shard, latencies in LATENCIES.items():
        for latency in latencies:
            finished_job(shard, latency, finished_minutes_ago=5)
    # Outside a 15-minute window: counted only in a wider one.
    finished_job(2, 120.0, finished_minutes_ago=30)
    # READY jobs deferred by an hour: READY depth, not yet due.
    later = timezone.now() + timedelta(hours=1)
    waiting = [ship.using(run_after=later).enqueue(order_id=5) for _ in range(4)]
    waiting_shard = shard_of(waiting[0].id)
    owner = register_worker("dash-host", 6001)
    hold_shards(owner, [2, 5])

    page = open_admin(viewer)
    page.goto("/admin/shardq/")
    page.get_by_role("link", name="Dashboard").click()
    expect(page.locator("#dashboard-table tbody tr[data-shard]")).to_have_count(64)

    for shard, latencies in LATENCIES.items():
        row = page.locator(f"#shard-{shard}")
        expect(row.locator("[data-col=finished]")).to_have_text(str(len(latencies)))
        for column, fraction in (("p50", 0.5), ("p99", 0.99)):
            expected = percentile_cont(latencies, fraction)
            cell = row.locator(f"[data-col={column}]")
            assert cell_seconds(cell) == pytest.approx(expected, abs=1e-6), (shard, column)
            expect(cell).to_have_text(human_seconds(cell_seconds(cell)))
    every = [latency for latencies in LATENCIES.values() for latency in latencies]
    total = page.locator("#shard-total")
    assert cell_seconds(total.locator("[data-col=p50]")) == pytest.approx(percentile_cont(every, 0.5), abs=1e-6)
    assert cell_seconds(total.locator("[data-col=p99]")) == pytest.approx(percentile_cont(every, 0.99), abs=1e-6)
    expect(page.locator("#total-finished")).to_have_text(str(len(every)))
    expect(page.locator(f"#shard-{waiting_shard} [data-col=depth]")).to_have_text("4")
    expect(page.locator("#total-depth")).to_have_text("4")

    # The rule is on the page; shard 40 is hot by p99, shard 50 (2 jobs) is not judged on it.
    expect(page.locator("#hot-rule")).to_contain_text("p99 pickup latency is over 2 × the median shard's p99")
    expect(page.locator("#hot-shards li")).to_have_count(1)
    expect(page.locator("#hot-shards li[data-shard='40']")).to_contain_text("p99")
    expect(page.locator("#shard-40")).to_have_class("hot")
    for calm in (2, 5, 9, 50, waiting_shard):
        expect(page.locator(f"#shard-{calm} [data-col=hot]")).to_have_text("")
    # Shard 40's p99 bar is red; it has no READY job, so no bar in the depth chart.
    expect(page.locator("svg rect.hot")).to_have_count(1)
    expect(page.locator("[data-chart=p99-by-shard] rect.hot[data-label='40']")).to_have_count(1)

    # A wider window takes in the job that finished 30 minutes ago.
    page.fill("#minutes", "60")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#shard-2 [data-col=finished]")).to_have_text(str(len(LATENCIES[2]) + 1))
    assert cell_seconds(page.locator("#shard-2 [data-col=p99]")) == pytest.approx(
        percentile_cont([*LATENCIES[2], 120.0], 0.99), abs=1e-6
    )


def test_dashboard_refuses_a_bad_window_and_shows_the_default(open_admin, viewer):
    page = open_admin(viewer)
    page.goto("/admin/shardq/dashboard/?minutes=soon")
    expect(page.locator("#minutes-error")).to_contain_text("minutes='soon' is not a whole number of minutes")
    expect(page.locator("#minutes")).to_have_value("15")
    expect(page.locator("#dashboard-table tbody tr[data-shard]")).to_have_count(64)
    expect(page.locator("#no-hot-shards")).to_be_visible()


def test_dashboard_needs_its_view_permission(open_admin, django_user_model, transactional_db):
    staff = make_user(django_user_model, "no-dashboard", permissions=["view_job"])
    page = open_admin(staff)
    response = page.goto("/admin/shardq/dashboard/")
    assert response.status == 403


def chart_value(page, chart: str, element: str, label: str, series: str | None = None) -> float:
    scope = f"[data-chart={chart}]" + (f" [data-series='{series}']" if series and element == "circle" else "")
    extra = f"[data-series='{series}']" if series and element == "rect" else ""
    return float(page.locator(f"{scope} {element}[data-label='{label}']{extra}").get_attribute("data-value"))


def test_dashboard_charts_the_last_hour_a_minute_at_a_time_with_axes(open_admin, viewer):
    (minute,) = sql("SELECT date_trunc('minute', clock_timestamp())")[0]
    # Minute M-10: 3 SUCCESSFUL and 1 FAILED, each claimed `latency` after due.
    for latency, status in ((0.1, "SUCCESSFUL"), (0.2, "SUCCESSFUL"), (0.3, "SUCCESSFUL"), (0.4, "FAILED")):
        sql(
            """
            WITH t AS (SELECT %(m)s::timestamptz - interval '10 min' + interval '30 s' AS done)
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash,
                shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs,
                return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at, finished_at)
            SELECT 'tests.taskapp.admin_tasks.ship', 'default', 'default', 0,
                   t.done - interval '1 s' - make_interval(secs => %(latency)s), 3, 3, NULL, false, %(status)s,
                   2, 1, 1, 1, '[1]', '{}', '1', '[]', '[]', t.done - interval '2 s', t.done - interval '1 s',
                   t.done - interval '1 s', t.done
            FROM t
            """,
            {"m": minute, "latency": latency, "status": status},
        )
    # A: due at M-40 and still READY. B: due at M-30, started at M-20 (waited 10 minutes).
    a = ship.enqueue(order_id=61).id
    sql(
        "UPDATE shardq_job SET run_after = %s::timestamptz - interval '40 min' + interval '20 s' WHERE id = %s",
        [minute, a],
    )
    b = ship.enqueue(order_id=62).id
    sql(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', status_rank = 2, attempts = 1, "
        "run_after = %(m)s::timestamptz - interval '30 min' + interval '10 s', "
        "last_attempted_at = %(m)s::timestamptz - interval '20 min' + interval '10 s', "
        "finished_at = %(m)s::timestamptz - interval '20 min' + interval '15 s' WHERE id = %(id)s",
        {"m": minute, "id": b},
    )

    def label(minutes_before: int) -> str:
        return (minute - timedelta(minutes=minutes_before)).strftime("%H:%M")  # TIME_ZONE is UTC

    page = open_admin(viewer)
    page.goto("/admin/shardq/dashboard/")
    charts = page.locator("#timeseries figure[data-chart]")
    expect(charts).to_have_count(4)
    for key in ("finished", "pickup", "waiting", "oldest"):
        chart = page.locator(f"#timeseries [data-chart={key}]")
        # Axes: labelled y ticks from 0, time labels every 10 minutes, both axis titles.
        assert len(chart.locator(".y-axis text:not(.axis-title)").all_inner_texts()) >= 2
        assert len(chart.locator(".x-axis text:not(.axis-title)").all_inner_texts()) in (5, 6, 7)
        expect(chart.locator(".x-axis .axis-title")).to_contain_text("time (UTC)")
        expect(chart.locator(".y-axis .axis-title")).not_to_be_empty()

    assert chart_value(page, "finished", "rect", label(10), "SUCCESSFUL") == 3
    assert chart_value(page, "finished", "rect", label(10), "FAILED") == 1
    assert chart_value(page, "finished", "rect", label(20), "SUCCESSFUL") == 1  # B
    assert chart_value(page, "pickup", "circle", label(10), "p50") == pytest.approx(0.25)
    assert chart_value(page, "pickup", "circle", label(10), "p99") == pytest.approx(0.397)
    assert chart_value(page, "pickup", "circle", label(20), "p99") == pytest.approx(600)

    # Rebuilt from the jobs' times: A waits from M-40 on, B from M-30 until M-20.
    expected = {45: 0, 40: 1, 31: 1, 30: 2, 21: 2, 20: 1, 1: 1}
    for before, waiting in expected.items():
        assert chart_value(page, "waiting", "circle", label(before)) == waiting, before
    # The oldest wait at the end of minute M-31 is A's: 9 minutes 40 seconds.
    assert chart_value(page, "oldest", "circle", label(31)) == pytest.approx(9 * 60 + 40, abs=0.01)
    assert chart_value(page, "oldest", "circle", label(21)) == pytest.approx(19 * 60 + 40, abs=0.01)
