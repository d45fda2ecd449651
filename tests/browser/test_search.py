"""Search by an argument and filter by tag in a real browser (docs/admin.md,
"Tags and search"): ``customer_id=7`` in the job list's search box finds
the jobs enqueued with that keyword argument's value, never by a sensitive
argument; the tag filter and a row's tag link list a tag's jobs."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.taskapp.admin_tasks import charge, ship

pytestmark = pytest.mark.usefixtures("shards")


def result_ids(page) -> list[int]:
    return [int(text) for text in page.locator("#result_list tbody th.field-id").all_inner_texts()]


def test_search_by_an_argument_and_filter_by_tag(open_admin, viewer, tmp_path):
    found = [charge.enqueue(customer_id=7, amount=a, card="4111-1111").id for a in (120, 80)]
    vip = charge.using(tags=["billing", "vip"]).enqueue(customer_id=7, amount=990).id
    charge.enqueue(customer_id=8, amount=50, card="4111-1111")
    ship.enqueue(order_id=7)  # another task's 7, another argument: not found
    page = open_admin(viewer)
    page.goto("/admin/shardq/job/")
    expect(page.locator("#changelist-search .help, #searchbar_helptext").first).to_contain_text("customer_id=7")
    page.locator("#searchbar").fill("customer_id=7")
    page.locator("#searchbar").press("Enter")
    expect(page.locator("#result_list tbody tr")).to_have_count(3)
    assert result_ids(page) == sorted(map(int, [*found, vip]), reverse=True)
    expect(page.locator("#result_list code.shardq-args").first).to_contain_text("customer_id=7")
    expect(page.locator("#result_list")).not_to_contain_text("4111-1111")  # card is sensitive
    expect(page.locator("#result_list a.shardq-tag", has_text="vip")).to_have_count(1)
    target = os.environ.get("SHARDQ_SCREENSHOTS")
    shots = Path(target) if target else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    # The top of the page: the search box, its help and the rows found (the
    # filter column runs long with the test suite's many tasks).
    page.set_viewport_size({"width": 1280, "height": 560})
    page.screenshot(path=shots / "admin-search-argument.png")

    # A sensitive argument is never searched: a match would confirm a guess.
    page.locator("#searchbar").fill('card="4111-1111"')
    page.locator("#searchbar").press("Enter")
    expect(page.locator("#result_list")).to_have_count(0)

    # The tag link of a row lists the tag's jobs; the filter does the same.
    page.goto("/admin/shardq/job/?q=customer_id%3D7")
    page.locator("#result_list a.shardq-tag", has_text="vip").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert result_ids(page) == [int(vip)]
    page.goto("/admin/shardq/job/")
    page.locator("#changelist-filter").get_by_role("link", name="billing").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(4)
