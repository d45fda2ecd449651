"""The admin's Limits page in a real browser (docs/limits.md): each limit's
capacity, slots in use, who holds them, waiting jobs and a rate's tokens."""

import pytest
from playwright.sync_api import expect

import shardq
from tests.browser.rows import make_user, register_worker, sql
from tests.taskapp import limit_tasks

pytestmark = pytest.mark.usefixtures("shards")


def test_the_limits_page_shows_capacity_use_holders_and_waiting_jobs(open_admin, django_user_model):
    viewer = make_user(django_user_model, "limits-viewer", permissions=["view_limitslot"])
    worker = register_worker("box-a", 41)
    sql("UPDATE shardq_worker SET name = 'mailer-1' WHERE id = %s", [worker])
    jobs = [int(r.id) for r in shardq.enqueue_many(limit_tasks.three_at_once, [((i,), {}) for i in range(7)])]
    key = f"t:{limit_tasks.three_at_once.module_path}"
    # Two of its three slots owned by the worker (as a limited claim leaves them).
    sql(
        "INSERT INTO shardq_limit_slot (limit_key, slot, worker_id, taken_at, expires_at) "
        "SELECT %s, g, %s, clock_timestamp(), clock_timestamp() + interval '30 seconds' "
        "FROM generate_series(0, 1) g",
        [key, worker],
    )
    sql("UPDATE shardq_job SET status = 'RUNNING' WHERE id = ANY(%s)", [jobs[:2]])
    sql("INSERT INTO shardq_limit_slot (limit_key, slot) VALUES (%s, 2)", [key])
    limit_tasks.twenty_a_second.enqueue()
    page = open_admin(viewer)
    page.get_by_role("link", name="Limits").click()
    row = page.locator(f"#limits tr[data-key='{key}']")
    expect(row.locator(".capacity")).to_have_text("3")
    expect(row.locator(".in-use")).to_have_text("2")
    expect(row.locator(".holders")).to_have_text("mailer-1: 2")
    expect(row.locator(".waiting")).to_have_text("5")
    rate = page.locator(f"#limits tr[data-key='t:{limit_tasks.twenty_a_second.module_path}']")
    expect(rate.locator(".rate")).to_have_text("20/s (burst 2)")
    expect(rate.locator(".waiting")).to_have_text("1")
    expect(rate.locator(".tokens")).to_have_text("2")


def test_a_limit_by_the_shard_key_shows_its_running_jobs_and_who_runs_them(open_admin, django_user_model):
    from tests.taskapp import key_limit_tasks

    viewer = make_user(django_user_model, "limits-viewer-2", permissions=["view_limitslot"])
    worker = register_worker("box-b", 42)
    sql("UPDATE shardq_worker SET name = 'sync-1' WHERE id = %s", [worker])
    jobs = [int(r.id) for r in shardq.enqueue_many(key_limit_tasks.per_account, [(("acme",), {}) for _ in range(5)])]
    # Two running on that worker (its id last in worker_ids, as the start writes it), one claimed.
    sql(
        "UPDATE shardq_job SET status = 'RUNNING', worker_ids = jsonb_build_array(%s::text) WHERE id = ANY(%s)",
        [worker, jobs[:2]],
    )
    sql("UPDATE shardq_job SET status = 'CLAIMED' WHERE id = %s", [jobs[2]])
    page = open_admin(viewer)
    page.get_by_role("link", name="Limits").click()
    row = page.locator(f"#limits tr[data-key='t:{key_limit_tasks.per_account.module_path}=acme']")
    expect(row.locator(".kind")).to_have_text("partition by shard key")
    expect(row.locator(".capacity")).to_have_text("2")
    expect(row.locator(".in-use")).to_have_text("2")
    expect(row.locator(".holders")).to_have_text("sync-1: 2")
    expect(row.locator(".waiting")).to_have_text("3")
