"""The shard map and the worker list, in a real browser."""

import pytest
from playwright.sync_api import expect

from shardq.conf import get_config
from tests.browser.rows import changelist_row, csrf_post, hold_shards, register_worker, shard_of, sql
from tests.taskapp.admin_tasks import ship

pytestmark = pytest.mark.usefixtures("shards")


def test_shard_map_shows_every_shard_with_its_owner_lease_and_ready_depth(open_admin, superuser):
    live = register_worker("worker-a", 4101)
    dead = register_worker("worker-b", 4102, heartbeat_age=5 * get_config().lease_ttl_seconds)
    # Seven READY jobs of one key: one shard.
    jobs = [ship.enqueue(order_id=77) for _ in range(7)]
    busy = shard_of(jobs[0].id)
    held = sorted({busy, (busy + 1) % 64})
    expired = (busy + 2) % 64
    hold_shards(live, held, lease_seconds=30)
    hold_shards(dead, [expired], lease_seconds=-3)
    version = sql("SELECT claim_version FROM shardq_shard WHERE shard = %s", [busy])[0][0]

    page = open_admin(superuser)
    page.get_by_role("link", name="Shards").first.click()
    expect(page.locator("#result_list tbody tr")).to_have_count(64)

    row = changelist_row(page, "shard", busy)
    owner = row.locator("td.field-owner_display")
    expect(owner).to_contain_text("worker-a:4101")
    expect(owner.locator("[data-worker-id]")).to_have_attribute("data-worker-id", live)
    expect(row.locator("td.field-claim_version")).to_have_text(str(version))
    expect(row.locator("td.field-ready_depth_display")).to_have_text("7")
    lease_left = float(row.locator("td.field-lease_left_display [data-seconds]").get_attribute("data-seconds"))
    assert 0 < lease_left <= 30
    waits = float(row.locator("td.field-oldest_ready_display [data-seconds]").get_attribute("data-seconds"))
    assert waits >= 0

    # Every other shard has no READY job; an expired lease says so.
    depths = page.locator("#result_list td.field-ready_depth_display").all_inner_texts()
    assert sorted(depths) == ["0"] * 63 + ["7"]
    expect(changelist_row(page, "shard", expired).locator("td.field-owner_display")).to_contain_text("lease expired")
    expect(changelist_row(page, "shard", expired).locator("td.field-lease_left_display")).to_contain_text("expired")
    unowned = next(s for s in range(64) if s not in {*held, expired})
    expect(changelist_row(page, "shard", unowned).locator("td.field-owner_display")).to_have_text("—")

    # The lease filter.
    page.get_by_role("link", name="held (unexpired)").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(len(held))

    # Read-only: no add link, and the shard's page has no save or delete button.
    expect(page.locator("#content-main a.addlink")).to_have_count(0)
    # A lease row's page is at its id (one row per pool and shard).
    row_id = sql("SELECT id FROM shardq_shard WHERE pool = '*' AND shard = %s", [busy])[0][0]
    page.goto(f"/admin/shardq/shard/{row_id}/change/")
    expect(page.locator(".field-owner_display")).to_contain_text("worker-a:4101")
    expect(page.locator(".field-recent_events table")).to_contain_text("claim")
    expect(page.locator("input[name=_save]")).to_have_count(0)
    expect(page.locator("a.deletelink")).to_have_count(0)
    response = csrf_post(page, f"/admin/shardq/shard/{row_id}/change/", {"shard": busy, "owner": "", "_save": "Save"})
    assert response.status == 403 and "CSRF" not in response.text()  # PermissionDenied: nobody changes a shard row
    assert sql("SELECT owner::text FROM shardq_shard WHERE shard = %s", [busy])[0][0] == live


def test_worker_list_tells_live_dead_and_stopped_workers_apart(open_admin, viewer, settings):
    # Live = heartbeat within LEASE_TTL: a TTL long enough for the page to load
    # whatever SHARDQ_LEASE_TTL this run has (the live server reads the same settings).
    settings.SHARDQ = {**settings.SHARDQ, "LEASE_TTL": 30.0}
    ttl = get_config().lease_ttl_seconds
    live = register_worker("live-host", 5001, stats={"succeeded": 12, "fence_rejections": 1})
    dead = register_worker("dead-host", 5002, heartbeat_age=4 * ttl)
    stopped = register_worker("stopped-host", 5003, heartbeat_age=4 * ttl, state="STOPPED")
    hold_shards(live, [3, 4, 5])

    page = open_admin(viewer)
    page.goto("/admin/shardq/worker/")
    expect(page.locator("#result_list tbody tr")).to_have_count(3)

    def liveness(host):
        return changelist_row(page, "host_display", host).locator("[data-liveness]")

    expect(liveness("live-host")).to_have_text("live")
    expect(liveness("dead-host")).to_have_text("dead")
    expect(liveness("stopped-host")).to_have_text("stopped")
    expect(changelist_row(page, "host_display", "live-host").locator("td.field-shards_held_display")).to_have_text("3")
    expect(changelist_row(page, "host_display", "dead-host").locator("td.field-shards_held_display")).to_have_text("0")
    expect(changelist_row(page, "host_display", "live-host").locator("td.field-counters_short")).to_contain_text(
        "succeeded=12"
    )
    age = float(
        changelist_row(page, "host_display", "dead-host").locator("[data-seconds]").get_attribute("data-seconds")
    )
    assert age >= 4 * ttl

    page.get_by_role("link", name="dead", exact=True).click()
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("#result_list")).to_contain_text("dead-host")

    page.goto(f"/admin/shardq/worker/{live}/change/")
    expect(page.locator(".field-shards_display")).to_contain_text("3, 4, 5")
    expect(page.locator(".field-counters_table")).to_contain_text("fence_rejections")
    expect(page.locator("input[name=_save]")).to_have_count(0)
    assert {dead, stopped} <= {row[0] for row in sql("SELECT id::text FROM shardq_worker")}
