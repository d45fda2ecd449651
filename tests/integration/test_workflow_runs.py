"""Workflows run by one worker in this process (issue 16): every edge
respected, parent results passed down, and ParentFailed through a real
dead-letter. Over several worker processes: tests/acceptance/test_workflows.py."""

import pytest
from django.db import transaction

from shardq import Workflow
from tests.helpers import edge_violations, in_process_worker, scalar, sql, wait_until
from tests.taskapp.tasks import fail, wf_node

pytestmark = pytest.mark.django_db(transaction=True)


def status_counts() -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM shardq_job GROUP BY status"))


def test_the_order_workflow_runs_in_order_and_children_read_their_parents_results():
    with in_process_worker(concurrency=4):
        with transaction.atomic():
            wf = Workflow(name="order-7")
            charge = wf.add(wf_node, "charge")
            pack = wf.add(wf_node, "pack", after=[charge])
            mail = wf.add(wf_node, "mail", after=[charge])
            wf.add(wf_node, "done", after=[pack, mail])
            results = wf.enqueue()
        wait_until(
            lambda: status_counts() == {"SUCCESSFUL": 4},
            timeout=20,
            message=lambda: (
                sql("SELECT id, status, waiting_on, children_pending, finished_at FROM shardq_job ORDER BY id")
                + sql("SELECT * FROM shardq_edge")
            ),
        )
    done = results[-1]
    done.refresh()
    assert done.return_value == {
        "tag": "done",
        "parents": {"wf_node[2]": ["SUCCESSFUL", "pack"], "wf_node[3]": ["SUCCESSFUL", "mail"]},
    }
    assert edge_violations() == 0


def test_a_dead_lettered_parent_cancels_its_children_and_run_children_see_the_failure():
    with in_process_worker(concurrency=2):
        wf = Workflow()
        bad = wf.add(fail, "boom", step_name="bad")
        skipped = wf.add(wf_node, "skipped", after=[bad])
        wf.add(wf_node, "after-skipped", after=[skipped])
        wf.add(wf_node, "cleanup", after=[bad], on_parent_failure="run")
        results = wf.enqueue()
        wait_until(lambda: status_counts() == {"FAILED": 3, "SUCCESSFUL": 1}, timeout=60, message=status_counts)
    for result in results:
        result.refresh()
    assert results[1].errors[-1].exception_class_path == "shardq.exceptions.ParentFailed"
    assert results[2].errors[-1].exception_class_path == "shardq.exceptions.ParentFailed"
    assert f"parent job {results[1].id} " in results[2].errors[-1].traceback
    assert results[3].return_value == {"tag": "cleanup", "parents": {"bad": ["FAILED", None]}}
    # The cancelled ones never ran: no ledger row, no attempt.
    assert (
        scalar("SELECT count(*) FROM taskapp_ledger WHERE job_id = ANY(%s)", [[int(results[1].id), int(results[2].id)]])
        == 0
    )
    assert edge_violations() == 0
