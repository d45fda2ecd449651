"""Workflows (issue 16): the graph's enqueue, the resolver's statement over
a real PostgreSQL, ParentFailed propagation, the admin's Retry reviving
children, the prune guard. Parents are finished here by writing their rows
as an ack would; real workers run workflows in tests/acceptance/."""

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.urls import reverse

from shardq import Workflow, WorkflowError, cancel
from shardq.conf import get_config
from shardq.db import operations
from shardq.db.store import WorkerStore
from tests.helpers import job_row, wait_until
from tests.integration.conftest import execute, job_count
from tests.taskapp.tasks import wf_fan_in, wf_node

pytestmark = pytest.mark.django_db(transaction=True)

ALL_SHARDS = list(range(64))


def finish(result, status="SUCCESSFUL", tag=None):
    """Write the outcome an ack would (the resolver reads nothing else)."""
    execute(
        "UPDATE shardq_job SET status = %s, status_rank = status_rank + 3, finished_at = clock_timestamp(),"
        " return_value = %s::jsonb WHERE id = %s",
        [status, '{"tag": "%s"}' % (tag or result.id) if status == "SUCCESSFUL" else None, int(result.id)],
    )


def resolve(store=None):
    own = store is None
    store = store or WorkerStore()
    try:
        total = 0
        while True:
            parents, children = store.resolve_children(ALL_SHARDS, 256, get_config().channel)
            total += len(children)
            if parents == 0:
                return total
    finally:
        if own:
            store.close()


def status(result):
    return job_row(result.id)["status"]


def order_workflow():
    wf = Workflow(name="order-7")
    charge = wf.add(wf_node, "charge")
    pack = wf.add(wf_node, "pack", after=[charge])
    mail = wf.add(wf_node, "mail", after=[charge])
    done = wf.add(wf_node, "done", after=[pack, mail], on_parent_failure="run")
    return wf, (charge, pack, mail, done)


def test_a_workflow_is_enqueued_with_its_roots_ready_and_the_rest_waiting():
    wf, steps = order_workflow()
    with transaction.atomic():
        results = wf.enqueue()
    done = results[3]
    assert [status(r) for r in results] == ["READY", "WAITING", "WAITING", "WAITING"]
    assert [job_row(r.id)["waiting_on"] for r in results] == [0, 1, 1, 2]
    assert [job_row(r.id)["children_pending"] for r in results] == [True, True, True, False]
    assert {job_row(r.id)["workflow"] for r in results} == {"order-7"}
    # Django has no WAITING: its API shows READY.
    assert [r.status for r in results] == [TaskResultStatus.READY] * 4
    assert wf_node.get_backend().get_result(done.id).status == TaskResultStatus.READY
    assert steps[3].result.id == done.id
    with connection.cursor() as cursor:
        cursor.execute("SELECT parent, child, name, run_on_failure FROM shardq_edge ORDER BY child, parent")
        edges = cursor.fetchall()
    c, p, m, d = (int(r.id) for r in results)
    assert edges == [
        (c, p, "wf_node", False),
        (c, m, "wf_node", False),
        (p, d, "wf_node[2]", True),
        (m, d, "wf_node[3]", True),
    ]


def test_a_bad_step_stores_nothing_and_a_rollback_takes_the_whole_graph():
    wf = Workflow(name="bad")
    first = wf.add(wf_node, "a")
    wf.add(wf_node, "b", after=[first])
    wf.add(wf_node, object())  # not JSON
    with pytest.raises(InvalidTask, match="JSON"):
        wf.enqueue()
    assert job_count() == 0
    wf2, _ = order_workflow()
    with pytest.raises(RuntimeError), transaction.atomic():
        wf2.enqueue()
        raise RuntimeError("the caller rolls back")
    assert job_count() == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shardq_edge")
        assert cursor.fetchone()[0] == 0


def test_after_names_only_jobs_that_exist_and_steps_of_the_same_workflow():
    with pytest.raises(WorkflowError, match=r"999999.*do not exist"):
        wf_node.using(after=["999999"]).enqueue("orphan")
    assert job_count() == 0
    with pytest.raises(WorkflowError, match="not a job id"):
        wf_node.using(after=["07"])
    with pytest.raises(WorkflowError, match="must be a list"):
        wf_node.using(after="12")
    other = Workflow()
    foreign = other.add(wf_node, "x")
    wf = Workflow()
    with pytest.raises(WorkflowError, match="another workflow"):
        wf.add(wf_node, "y", after=[foreign])
    with pytest.raises(WorkflowError, match="on_parent_failure must be"):
        wf.add(wf_node, "y", on_parent_failure="ignore")
    with pytest.raises(WorkflowError, match="on_parent_failure must be"):
        wf_node.using(on_parent_failure="skip")
    step = wf.add(wf_node, "z")
    with pytest.raises(WorkflowError, match="named twice"):
        wf.add(wf_node, "w", after=[step, step])
    with pytest.raises(WorkflowError, match="step named"):
        wf.add(wf_node, "v", step_name="wf_node")


def test_the_child_becomes_ready_only_when_its_last_parent_succeeded_and_its_shard_is_notified(second_connection):
    wf, _ = order_workflow()
    charge, pack, mail, done = wf.enqueue()
    second_connection.execute(f"LISTEN {get_config().channel}")
    assert resolve() == 0  # nothing finished: nothing moves
    finish(charge)
    assert resolve() == 2
    assert (status(pack), status(mail), status(done)) == ("READY", "READY", "WAITING")
    notified = {n.payload for n in second_connection.notifies(timeout=1, stop_after=2)}
    assert notified >= {f"{job_row(pack.id)['shard']}:0", f"{job_row(mail.id)['shard']}:0"}
    assert job_row(charge.id)["children_pending"] is False
    finish(pack)
    resolve()
    assert status(done) == "WAITING" and job_row(done.id)["waiting_on"] == 1
    finish(mail)
    resolve()
    assert status(done) == "READY" and job_row(done.id)["waiting_on"] == 0
    # Due when it became READY, not when it was enqueued (the pickup latency).
    assert job_row(done.id)["run_after"] >= job_row(mail.id)["finished_at"]


def test_a_failed_parent_cancels_its_children_with_parent_failed_down_the_graph():
    wf = Workflow()
    a = wf.add(wf_node, "a")
    b = wf.add(wf_node, "b", after=[a])
    c = wf.add(wf_node, "c", after=[b])
    runs = wf.add(wf_node, "runs", after=[a], on_parent_failure="run")
    ra, rb, rc, rruns = wf.enqueue()
    finish(ra, "FAILED")
    resolve()
    rows = {r.id: job_row(r.id) for r in (rb, rc, rruns)}
    assert rows[rb.id]["status"] == "FAILED"
    assert rows[rb.id]["errors"][-1]["exception_class_path"] == "shardq.exceptions.ParentFailed"
    assert f"parent job {ra.id} (tests.taskapp.tasks.wf_node)" in rows[rb.id]["errors"][-1]["traceback"]
    assert rows[rc.id]["status"] == "FAILED"  # propagated in a later pass of the same resolve()
    assert f"parent job {rb.id} " in rows[rc.id]["errors"][-1]["traceback"]
    assert rows[rruns.id]["status"] == "READY"
    assert wf_node.get_backend().get_result(rc.id).errors[-1].exception_class_path == "shardq.exceptions.ParentFailed"
    del b, c, runs


def test_a_cancelled_parent_counts_as_failed_and_a_waiting_job_can_be_cancelled():
    parent = wf_node.enqueue("p")
    child = wf_node.using(after=[parent]).enqueue("c")
    grandchild = wf_node.using(after=[child.id]).enqueue("g")
    assert status(child) == "WAITING"
    assert cancel(child) == [child.id]  # WAITING is not finished: cancellable
    finish(parent)
    resolve()
    assert status(child) == "FAILED"
    assert job_row(child.id)["errors"][-1]["exception_class_path"] == "shardq.exceptions.Cancelled"
    assert status(grandchild) == "FAILED"
    assert f"parent job {child.id} " in job_row(grandchild.id)["errors"][-1]["traceback"]
    assert job_row(parent.id)["children_pending"] is False


def test_a_child_of_a_job_already_finished_is_moved_on_by_the_next_pass():
    parent = wf_node.enqueue("p")
    finish(parent)
    child = wf_node.using(after=[parent]).enqueue("c")
    assert status(child) == "WAITING"
    resolve()
    assert status(child) == "READY"


def test_the_admin_retry_of_a_dead_lettered_parent_revives_the_children_it_cancelled(admin_client):
    wf = Workflow()
    a = wf.add(wf_node, "a")
    other = wf.add(wf_node, "other")
    b = wf.add(wf_node, "b", after=[a, other])
    wf.add(wf_node, "c", after=[b])
    ra, rother, rb, rc = wf.enqueue()
    finish(ra, "FAILED")
    finish(rother)
    resolve()
    assert (status(rb), status(rc)) == ("FAILED", "FAILED")
    response = admin_client.post(
        reverse("admin:shardq_job_changelist"),
        {"action": "retry_failed", "_selected_action": [ra.id]},
        follow=True,
    )
    assert response.status_code == 200
    assert "wait for them again" in response.content.decode()
    assert (status(ra), status(rb), status(rc)) == ("READY", "WAITING", "WAITING")
    # b waits for a again (other already succeeded and was counted); c for b.
    assert (job_row(rb.id)["waiting_on"], job_row(rc.id)["waiting_on"]) == (1, 1)
    resolve()
    assert (status(rb), status(rc)) == ("WAITING", "WAITING")
    finish(ra)
    resolve()
    assert status(rb) == "READY"
    finish(rb)
    resolve()
    assert status(rc) == "READY"


def test_a_revived_child_with_another_failed_parent_is_cancelled_again_naming_it():
    wf = Workflow()
    a = wf.add(wf_node, "a")
    q = wf.add(wf_node, "q")
    wf.add(wf_node, "b", after=[a, q])
    ra, rq, rb = wf.enqueue()
    finish(ra, "FAILED")
    resolve()
    finish(rq, "FAILED")
    resolve()
    assert f"parent job {ra.id} " in job_row(rb.id)["errors"][-1]["traceback"]
    operations.run("admin_retry_failed_jobs", {"ids": [int(ra.id)], "notify": False, "channel": "x"})
    assert [row[0] for row in operations.run("revive_children", {"ids": [int(ra.id)]})] == [int(rb.id)]
    resolve()
    assert status(rb) == "FAILED"
    assert f"parent job {rq.id} " in job_row(rb.id)["errors"][-1]["traceback"]


def test_a_resolver_that_dies_midway_leaves_its_parents_for_the_next_pass(second_connection):
    parent = wf_node.enqueue("p")
    first = wf_node.using(after=[parent]).enqueue("c1")
    second = wf_node.using(after=[parent]).enqueue("c2")
    finish(parent)
    # Another session holds the second child's row: the pass blocks there,
    # after it has locked the parent and updated the edges.
    second_connection.execute("BEGIN")
    second_connection.execute("SELECT 1 FROM shardq_job WHERE id = %s FOR UPDATE", [int(second.id)])
    store = WorkerStore()
    errors = []

    def run():
        try:
            resolve(store)
        except Exception as exc:  # the connection killed under it
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    pid = store.conn.info.backend_pid if store.conn else None

    pid = wait_until(lambda: store.conn and store.conn.info.backend_pid)
    wait_until(
        lambda: (
            operations.run("has_edges", {"id": int(parent.id)})  # any query: let it reach the lock
            and _waiting_for_lock(pid)
        )
    )
    with psycopg.connect(**_kwargs(), autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    thread.join(10)
    store.close()
    second_connection.execute("ROLLBACK")
    assert errors, "the resolver's connection was killed mid-statement"
    assert (status(first), status(second)) == ("WAITING", "WAITING")
    assert job_row(parent.id)["children_pending"] is True
    resolve()
    assert (status(first), status(second)) == ("READY", "READY")


def _kwargs():
    from shardq.db.store import connection_kwargs

    return connection_kwargs()


def _waiting_for_lock(pid) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row and row[0] == "Lock")


def test_prune_keeps_a_parent_whose_children_still_wait():
    wf = Workflow()
    a = wf.add(wf_node, "a")
    slow = wf.add(wf_node, "slow")
    wf.add(wf_node, "child", after=[a, slow])
    ra, rslow, rchild = wf.enqueue()
    finish(ra)
    execute("UPDATE shardq_job SET finished_at = clock_timestamp() - interval '30 days' WHERE id = %s", [int(ra.id)])
    cutoff = operations.run("time_before", {"age": timedelta(days=1)}, fetch="one")[0]

    def prune():
        return operations.run(
            "prune_jobs", {"after": 0, "batch": 1000, "statuses": ["SUCCESSFUL", "FAILED"], "cutoff": cutoff}
        )[0][2]

    assert prune() == 0  # not resolved yet
    resolve()
    assert prune() == 0  # resolved, but its child still waits for slow
    assert job_row(ra.id) is not None
    finish(rslow)
    resolve()
    assert status(rchild) == "READY"
    assert prune() == 1
    assert job_row(ra.id) is None


def test_a_fan_in_child_waits_for_every_parent():
    wf = Workflow(name="fan")
    root = wf.add(wf_node, "root")
    middle = [wf.add(wf_node, f"m{i}", after=[root]) for i in range(300)]
    wf.add(wf_fan_in, after=middle)
    results = wf.enqueue()
    finish(results[0])
    resolve()
    assert {status(r) for r in results[1:-1]} == {"READY"}
    for r in results[1:-2]:
        finish(r)
    resolve()
    assert status(results[-1]) == "WAITING" and job_row(results[-1].id)["waiting_on"] == 1
    finish(results[-2])
    resolve()
    assert status(results[-1]) == "READY"


def test_the_admin_discard_keeps_a_failed_parent_until_its_children_moved_on(admin_client):
    parent = wf_node.enqueue("p")
    child = wf_node.using(after=[parent]).enqueue("c")
    finish(parent, "FAILED")

    def discard():
        admin_client.post(
            reverse("admin:shardq_job_changelist"), {"action": "discard_failed", "_selected_action": [parent.id]}
        )

    discard()
    assert job_row(parent.id) is not None  # deleted now, the child would wait for ever
    resolve()
    assert status(child) == "FAILED"
    discard()
    assert job_row(parent.id) is None


def test_enqueue_many_of_a_task_with_after_makes_every_call_wait():
    from shardq import enqueue_many

    parent = wf_node.enqueue("p")
    children = enqueue_many(wf_node.using(after=[parent]), [(("a",), {}), (("b",), {})])
    assert [status(c) for c in children] == ["WAITING", "WAITING"]
    finish(parent)
    resolve()
    assert [status(c) for c in children] == ["READY", "READY"]
