import json
from io import StringIO

import pytest
from django.core.management import call_command

import shardq
from tests.taskapp import tasks


@pytest.mark.django_db
def test_status_reports_job_counts_and_the_ready_lag_as_json():
    shardq.enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert status["jobs"] == {"READY": 2}
    assert status["oldest_ready_seconds"] >= 0
    assert status["workers"] == []


@pytest.mark.django_db
def test_status_prints_a_table_for_people():
    out = StringIO()
    call_command("shardq_status", stdout=out)
    assert "unowned shards:" in out.getvalue() and "no READY job is due" in out.getvalue()


@pytest.mark.django_db
def test_status_shows_a_workers_readable_name_next_to_its_uuid():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO shardq_worker (id, host, pid, queues, started_at, heartbeat_at, state, stats, name) "
            "VALUES ('00000000-0000-0000-0000-0000000000aa', 'h', 1, '[]', now(), now(), 'RUNNING', '{}', "
            "'billing-1')"
        )
    out = StringIO()
    call_command("shardq_status", stdout=out)
    assert "00000000-0000-0000-0000-0000000000aa (billing-1)" in out.getvalue()
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    [worker] = json.loads(out.getvalue())["workers"]
    assert worker["name"] == "billing-1"


@pytest.mark.django_db(transaction=True)
def test_status_shows_each_live_pool_and_the_queues_no_live_pool_serves():
    import uuid

    from shardq.db.store import WorkerStore

    worker = str(uuid.uuid4())
    store = WorkerStore(application_name="test-status-pools")
    try:
        store.register_worker(worker, "mail-host", 1, ["emails"], pool="emails")
        store.claim_shards(worker, 64, 30.0, 64, 3, pool="emails")
        shardq.enqueue_many(tasks.add.using(queue_name="emails"), [((1, 2), {})])
        shardq.enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])  # queue "reports": nobody serves it
        out = StringIO()
        call_command("shardq_status", "--json", stdout=out)
        status = json.loads(out.getvalue())
        assert status["pools"] == [{"pool": "emails", "workers": 1, "shards_held": 64, "unowned_shards": 0}]
        assert status["unowned_shards"] == 0
        assert status["unserved_queues"] == {"reports": 2}
        assert [w["pool"] for w in status["workers"]] == ["emails"]
        out = StringIO()
        call_command("shardq_status", stdout=out)
        text = out.getvalue()
        assert "pool emails: 1 live worker(s), 64 shards held, 0 unowned" in text
        assert "due READY jobs that no live worker's pool serves: reports 2" in text
    finally:
        store.close()
