"""The admin's workflow graph (issue 16), in a real browser: the job page
links to it, and it draws every job of the workflow with its status and
every edge, server-side (an SVG, no script)."""

import pytest
from playwright.sync_api import expect

from shardq import Workflow
from tests.browser.rows import fail_job
from tests.taskapp.tasks import wf_node

pytestmark = pytest.mark.usefixtures("shards")


def test_the_job_page_links_to_its_workflow_graph(open_admin, viewer):
    wf = Workflow(name="order-7")
    charge = wf.add(wf_node, "charge")
    pack = wf.add(wf_node, "pack", after=[charge])
    mail = wf.add(wf_node, "mail", after=[charge])
    wf.add(wf_node, "done", after=[pack, mail])
    results = wf.enqueue()
    alone = wf_node.enqueue("alone")
    fail_job(results[0].id)

    page = open_admin(viewer)
    page.goto(f"/admin/shardq/job/{alone.id}/change/")
    expect(page.locator(".field-workflow_display")).to_contain_text("—")
    expect(page.locator("a.shardq-workflow-link")).to_have_count(0)

    page.goto(f"/admin/shardq/job/{results[1].id}/change/")
    link = page.locator("a.shardq-workflow-link")
    expect(link).to_have_text("order-7 graph")
    link.click()
    assert page.url.endswith(f"/admin/shardq/job/{results[1].id}/workflow/")
    svg = page.locator(".shardq-graph svg")
    expect(svg).to_be_visible()
    nodes = svg.locator("a[data-job]")
    expect(nodes).to_have_count(4)
    statuses = {int(n.get_attribute("data-job")): n.get_attribute("data-status") for n in nodes.all()}
    assert statuses == {
        int(results[0].id): "FAILED",
        int(results[1].id): "WAITING",
        int(results[2].id): "WAITING",
        int(results[3].id): "WAITING",
    }
    edges = {
        (int(e.get_attribute("data-parent")), int(e.get_attribute("data-child")))
        for e in svg.locator("line[data-parent]").all()
    }
    c, p, m, d = (int(r.id) for r in results)
    assert edges == {(c, p), (c, m), (p, d), (m, d)}
    # Every arrow points right: a child is drawn in a later column than its parents.
    for line in svg.locator("line[data-parent]").all():
        assert float(line.get_attribute("x2")) > float(line.get_attribute("x1"))
    assert svg.locator("script").count() == 0  # drawn by the server
    # A box leads back to its job's page.
    nodes.filter(has_text=f"#{d}").click()
    assert page.url.endswith(f"/admin/shardq/job/{d}/change/")
