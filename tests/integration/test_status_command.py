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


# Heartbeat ages (in LEASE_TTLs) and states, and the liveness each must read,
# in shardq_status and in the admin's worker list alike.
LIVENESS_CASES = {
    "fresh-runner": (0.0, "RUNNING", "live"),
    "late-runner": (0.8, "RUNNING", "live"),
    "silent-runner": (163 / 30, "RUNNING", "dead"),
    "draining": (0.0, "STOPPING", "stopping"),
    "silent-draining": (2.0, "STOPPING", "dead"),
    "gone": (0.0, "STOPPED", "stopped"),
}


def status_json() -> dict:
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
def test_status_shows_a_worker_silent_longer_than_the_lease_ttl_as_dead_and_does_not_count_it_live(settings):
    from tests.browser.rows import register_worker

    settings.SHARDQ = {**settings.SHARDQ, "LEASE_TTL": 30.0}
    register_worker("silent-host", 4242, heartbeat_age=163.0)
    [worker] = status_json()["workers"]
    assert (worker["state"], worker["liveness"]) == ("RUNNING", "dead")
    assert worker["heartbeat_age_seconds"] >= 163
    out = StringIO()
    call_command("shardq_status", stdout=out)
    [line] = [row for row in out.getvalue().splitlines() if "silent-host" in row]
    assert " dead " in line
    assert "workers: 0 live, 0 stopping, 1 dead" in out.getvalue()
    assert "pool *: 0 live worker(s)" in out.getvalue()


@pytest.mark.django_db
def test_the_admin_worker_list_and_shardq_status_read_every_worker_as_alive_or_dead_alike(settings, rf):
    from django.contrib.admin.sites import site

    from shardq.admin import WorkerAdmin
    from shardq.models import Worker
    from tests.browser.rows import register_worker

    settings.SHARDQ = {**settings.SHARDQ, "LEASE_TTL": 30.0}
    ids = {
        register_worker(host, 1, heartbeat_age=ttls * 30.0, state=state): (host, expected)
        for host, (ttls, state, expected) in LIVENESS_CASES.items()
    }
    admin_says = {
        str(w.id): w.liveness for w in WorkerAdmin(Worker, site).get_queryset(rf.get("/admin/shardq/worker/"))
    }
    status_says = {w["id"]: w["liveness"] for w in status_json()["workers"]}
    for worker, (host, expected) in ids.items():
        assert admin_says[worker] == expected, host
        if expected != "stopped":  # shardq_status lists the workers not stopped
            assert status_says[worker] == expected, host
    # And the pool's members, as the heartbeat statement counts them (the
    # workers that share its shards), are exactly the live ones.
    from django.db import connection

    from shardq.db.queries import QUERIES

    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["heartbeat"],
            {"worker": None, "stats": "{}", "pool": "*", "ttl": 30.0, "now": None, "dead": [], "client_pid": None},
        )
        members = {str(row[0]) for row in cursor.fetchall()}
    assert members == {w for w, (_, expected) in ids.items() if expected == "live"}
    assert status_json()["pools"] == [{"pool": "*", "workers": 2, "shards_held": 0, "unowned_shards": 64}]


@pytest.mark.django_db
def test_status_keeps_its_columns_aligned_under_a_long_worker_name_and_host():
    from django.db import connection

    long_name = "billing-worker-with-a-long-readable-name-7"
    long_host = "a-much-longer-host-name.eu-west-1.internal"
    with connection.cursor() as cursor:
        for wid, host, name in (
            ("00000000-0000-0000-0000-0000000000a1", "h", long_name),
            ("00000000-0000-0000-0000-0000000000a2", long_host, ""),
        ):
            cursor.execute(
                "INSERT INTO shardq_worker (id, host, pid, queues, started_at, heartbeat_at, state, stats, name) "
                "VALUES (%s, %s, 1, '[]', now(), now(), 'RUNNING', '{}', %s)",
                [wid, host, name],
            )
    out = StringIO()

    call_command("shardq_status", stdout=out)

    header, *rows = out.getvalue().splitlines()[:3]
    named = next(row for row in rows if long_name in row)
    hosted = next(row for row in rows if long_host in row)
    for column, named_cell, hosted_cell in (
        ("host:pid", "h:1", long_host + ":1"),
        ("pool", "*", "*"),
        ("liveness", "live", "live"),
        ("state", "RUNNING", "RUNNING"),
    ):
        at = header.index(column)
        assert named[at:].startswith(named_cell + " "), (column, header, named)
        assert hosted[at:].startswith(hosted_cell + " "), (column, header, hosted)
