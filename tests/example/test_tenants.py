"""The example project's two tenants (docs/fairness.md): the "noisy tenant"
button enqueues 2,000 reports, the quiet tenant's 20 enqueued after them
still run at once on a real worker, while the noisy backlog waits."""

import pytest

from example_project.demo import views
from example_project.demo.tasks import build_report
from shardq.models import Job
from tests.helpers import wait_until
from tests.workers import WorkerPool

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]


def reports(tenant, **filters) -> int:
    return Job.objects.filter(task_path=build_report.module_path, args__0=tenant, **filters).count()


def test_the_buttons_enqueue_each_tenants_reports_and_the_page_shows_them(db, client):
    page = client.get("/tenants/")
    assert 'id="noisy-button"' in page.text and 'id="quiet-button"' in page.text

    client.post("/tenants/noisy/")
    client.post("/tenants/quiet/")

    assert reports(views.NOISY, status="READY") == views.NOISY_REPORTS == 2000
    assert reports(views.QUIET, status="READY") == views.QUIET_REPORTS == 20
    figures = {t["tenant"]: t for t in client.get("/tenants/?format=json").json()["tenants"]}
    assert figures[views.NOISY]["waiting"] == 2000 and figures[views.QUIET]["waiting"] == 20


def test_the_quiet_tenant_runs_at_once_past_the_noisy_tenants_backlog(transactional_db, client, tmp_path):
    pool = WorkerPool(tmp_path)
    try:
        client.post("/tenants/noisy/")
        pool.start("--concurrency", "4")
        wait_until(
            lambda: reports(views.NOISY, status="SUCCESSFUL") >= 50, timeout=60, message="the noisy backlog to run"
        )
        client.post("/tenants/quiet/")

        wait_until(
            lambda: reports(views.QUIET, status="SUCCESSFUL") == views.QUIET_REPORTS,
            timeout=60,
            message="the quiet tenant's reports to finish",
        )
        figures = {t["tenant"]: t for t in client.get("/tenants/?format=json").json()["tenants"]}
    finally:
        pool.stop_all()

    print(f"quiet tenant: {figures[views.QUIET]}; noisy tenant: {figures[views.NOISY]}")
    # FIFO would have run all of the noisy backlog first (about 10 s on 4 threads).
    assert figures[views.NOISY]["waiting"] > 1000
    assert figures[views.QUIET]["pickup_p99_ms"] < 3000
