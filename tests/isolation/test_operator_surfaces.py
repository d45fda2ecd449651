"""Operator surfaces (issue 10): the admin and the commands against hostile
or odd input. A view-only staff user (the permissions of migration
0004_admin_permissions) reads nothing a task marks sensitive through URL
filters or the search; odd rows (infinite times, odd JSON, an unknown status)
render instead of failing; outcomes are bounded excerpts; viewing a job
imports nothing; row text printed to a terminal is escaped; every numeric
command flag is bounded.
"""

import json
import os
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from shardq.db.store import ensure_shards
from tests.browser.rows import VIEW_PERMISSIONS, make_user, sql
from tests.taskapp import operator_tasks

SECRET = "hunter2-s3cret"
JOBS = "/admin/shardq/job/"


@pytest.fixture
def viewer(client, django_user_model, db):
    user = make_user(django_user_model, "viewer", permissions=VIEW_PERMISSIONS)
    client.force_login(user)
    ensure_shards()
    return client


def insert_job(**columns) -> int:
    """A job row written by hand (raw SQL), with defaults for what is not given."""
    row = {
        "task_path": "tests.taskapp.operator_tasks.log_in",
        "backend": "default",
        "queue_name": "default",
        "priority": 0,
        "run_after": "now()",
        "shard": 0,
        "key_hash": 0,
        "shard_key": None,
        "ordered": False,
        "status": "READY",
        "status_rank": 0,
        "fence": 0,
        "attempts": 0,
        "max_attempts": 1,
        "args": "[]",
        "kwargs": "{}",
        "return_value": None,
        "errors": "[]",
        "worker_ids": "[]",
        "enqueued_at": "now()",
        "started_at": None,
        "finished_at": None,
        "last_attempted_at": None,
    }
    row.update(columns)
    names = list(row)
    values = []
    placeholders = []
    for name in names:
        value = row[name]
        if value == "now()":
            placeholders.append("clock_timestamp()")
        else:
            placeholders.append("%s")
            values.append(value)
    return sql(f"INSERT INTO shardq_job ({', '.join(names)}) VALUES ({', '.join(placeholders)}) RETURNING id", values)[
        0
    ][0]


def listed(response, job_id: int) -> bool:
    return f"{JOBS}{job_id}/change/" in response.content.decode()


# -- sensitive values through URL filters and the search ---------------------


@pytest.mark.parametrize(
    "query",
    [
        f"kwargs__password__startswith={SECRET[:3]}",
        f"kwargs__password__exact={SECRET}",
        f"args__1__startswith={SECRET[:3]}",
        f"args__0__startswith={SECRET[:3]}",
        f"shard_key__startswith={SECRET[:3]}",
        f"shard_key={SECRET}",
        "key_hash__gte=-2147483648",
        "return_value__contains=x",
        "errors__0__traceback__contains=x",
    ],
)
def test_a_view_only_user_cannot_filter_jobs_on_hidden_values(viewer, query):
    operator_tasks.log_in.enqueue(account="acct-1", password=SECRET)
    operator_tasks.log_in.enqueue("acct-2", SECRET)
    operator_tasks.use_token.enqueue(SECRET)
    response = viewer.get(f"{JOBS}?{query}")
    # Django's DisallowedModelAdminLookup: a 400, never a filtered list.
    assert response.status_code == 400


def test_the_exact_key_search_does_not_match_a_sensitive_shard_key(viewer):
    hidden = operator_tasks.use_token.enqueue(SECRET)
    shown = operator_tasks.log_in.enqueue(account="acct-77", password=SECRET)
    response = viewer.get(JOBS, {"q": SECRET})
    assert response.status_code == 200
    assert not listed(response, int(hidden.id))
    response = viewer.get(JOBS, {"q": "acct-77"})
    assert listed(response, int(shown.id))


def test_the_job_page_hides_the_hash_of_a_sensitive_shard_key(viewer):
    hidden = operator_tasks.use_token.enqueue(SECRET)
    (key_hash,) = sql("SELECT key_hash FROM shardq_job WHERE id = %s", [int(hidden.id)])[0]
    page = viewer.get(f"{JOBS}{hidden.id}/change/").content.decode()
    assert SECRET not in page and str(key_hash) not in page.replace(f"/{hidden.id}/", "")


def test_the_dashboard_links_still_filter_jobs_by_shard_and_status(viewer):
    job = operator_tasks.log_in.enqueue(account="acct-3", password=SECRET)
    (shard,) = sql("SELECT shard FROM shardq_job WHERE id = %s", [int(job.id)])[0]
    response = viewer.get(JOBS, {"shard__exact": shard, "status__exact": "READY"})
    assert response.status_code == 200 and listed(response, int(job.id))


# -- odd rows render ---------------------------------------------------------


@pytest.fixture
def odd_rows(viewer):
    """Rows no worker writes: infinite times, odd JSON, an unknown status."""
    job = insert_job(
        status="WEIRD",
        run_after="-infinity",
        enqueued_at="infinity",
        started_at="-infinity",
        finished_at="infinity",
        last_attempted_at="infinity",
        worker_ids='[""]',
        errors='"boom"',
        args='{"not": "a list"}',
        kwargs="[1, 2]",
        return_value='"x"',
        shard_key="k",
    )
    ready = insert_job(run_after="-infinity", enqueued_at="-infinity", shard=1)
    finished = insert_job(
        status="SUCCESSFUL",
        run_after="-infinity",
        last_attempted_at="infinity",
        finished_at="now()",
        errors='[1, {"traceback": 5}, null]',
        worker_ids='{"a": 1}',
        shard=1,
    )
    worker = str(uuid.uuid4())
    sql(
        "INSERT INTO shardq_worker (id, host, pid, queues, started_at, heartbeat_at, state, stats) "
        "VALUES (%s, 'odd', 1, '\"not-a-list\"', '-infinity', 'infinity', 'RUNNING', '[1, 2]')",
        [worker],
    )
    sql(
        "UPDATE shardq_shard SET owner = %s, lease_expires = 'infinity', claimed_at = '-infinity' WHERE shard = 0",
        [worker],
    )
    sql(
        "UPDATE shardq_shard SET owner = %s, lease_expires = '-infinity', claimed_at = 'infinity' WHERE shard = 1",
        [str(uuid.uuid4())],
    )
    sql(
        "INSERT INTO shardq_shard_event (shard, claim_version, worker, reason, rescued, at) "
        "VALUES (0, 1, %s, 'claim', 0, 'infinity')",
        [worker],
    )
    # Lease rows' admin pages are at their ids (one row per pool and shard).
    shard0, shard1 = (sql("SELECT id FROM shardq_shard WHERE pool = '*' AND shard = %s", [n])[0][0] for n in (0, 1))
    return {"job": job, "ready": ready, "finished": finished, "worker": worker, "shard0": shard0, "shard1": shard1}


@pytest.mark.parametrize(
    "page",
    [
        JOBS,
        "{job}",
        "{ready}",
        "{finished}",
        f"{JOBS}?status__exact=WEIRD",
        "/admin/shardq/worker/",
        "/admin/shardq/worker/{worker}/change/",
        "/admin/shardq/shard/",
        "/admin/shardq/shard/{shard0}/change/",
        "/admin/shardq/shard/{shard1}/change/",
        "/admin/shardq/shard/?lease=held",
        "/admin/shardq/shard/?lease=expired",
        "/admin/shardq/shard/?o=3",
        "/admin/shardq/worker/?liveness=dead",
        "/admin/shardq/shardevent/",
        "/admin/shardq/dashboard/",
    ],
)
def test_odd_rows_render_in_the_admin(viewer, odd_rows, page):
    for name in ("job", "ready", "finished"):
        if page == "{" + name + "}":
            page = f"{JOBS}{odd_rows[name]}/change/"
    page = page.format(**odd_rows)
    response = viewer.get(page)
    assert response.status_code == 200, page


def test_an_odd_job_shows_its_raw_values(viewer, odd_rows):
    page = viewer.get(f"{JOBS}{odd_rows['job']}/change/").content.decode()
    assert "infinity" in page and "WEIRD" in page and "boom" in page


def test_odd_rows_do_not_break_shardq_status(odd_rows):
    out = StringIO()
    call_command("shardq_status", stdout=out)
    assert "odd:1" in out.getvalue()
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    (odd,) = [w for w in status["workers"] if w["host"] == "odd"]
    assert odd["stats"] == [1, 2]
    assert status["oldest_ready_seconds"] == "inf"


# -- bounded outcomes --------------------------------------------------------


def test_a_huge_return_value_and_traceback_are_shown_as_excerpts(viewer):
    huge = "R" * 3_000_000
    job = insert_job(
        status="FAILED",
        return_value=json.dumps(huge),
        finished_at="now()",
        errors=json.dumps([{"exception_class_path": "builtins.ValueError", "traceback": "T" * 3_000_000}]),
    )
    response = viewer.get(f"{JOBS}{job}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    assert len(page) < 200_000
    assert "(3000002 bytes)" in page and "(3000000 bytes)" in page
    assert len(viewer.get(JOBS).content) < 200_000


def test_huge_arguments_are_not_served_in_the_list_or_the_page(viewer):
    job = insert_job(task_path="tests.taskapp.admin_tasks.ship", args=json.dumps(["A" * 3_000_000]))
    for url in (JOBS, f"{JOBS}{job}/change/"):
        response = viewer.get(url)
        assert response.status_code == 200 and len(response.content) < 200_000
        assert "too large to show" in response.content.decode()


# -- no import at view -------------------------------------------------------


def test_viewing_a_job_imports_nothing_its_task_path_names(viewer):
    os.environ.pop("SHARDQ_IMPORT_ALARM", None)
    sys.modules.pop("tests.taskapp.import_alarm", None)
    job = insert_job(task_path="tests.taskapp.import_alarm.anything", kwargs='{"password": "x"}')
    for url in (JOBS, f"{JOBS}{job}/change/"):
        assert viewer.get(url).status_code == 200
    assert "tests.taskapp.import_alarm" not in sys.modules
    assert "SHARDQ_IMPORT_ALARM" not in os.environ
    # Not resolvable, so every argument stays hidden.
    assert '"x"' not in viewer.get(f"{JOBS}{job}/change/").content.decode()


# -- terminal escapes --------------------------------------------------------


def test_shardq_status_escapes_control_characters_from_rows(db):
    sql(
        "INSERT INTO shardq_worker (id, host, pid, queues, started_at, heartbeat_at, state, stats) "
        "VALUES (%s, %s, 7, '[]', clock_timestamp(), clock_timestamp(), 'RUNNING', %s)",
        [str(uuid.uuid4()), "evil\x1b]0;pwned\x07\x1b[2J\r\u202ehost", json.dumps({"x\x1b[31m": "\x1b[0m", "n": 1})],
    )
    insert_job(status="\x1b[5mRUN")
    out = StringIO()
    call_command("shardq_status", stdout=out)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert "evil\\x1b]0;pwned\\x07" in text and "\\u202e" in text


# -- bounded flags -----------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("shardq_prune", ["--older-than", "99999999999d"], "--older-than must be from 0 to"),
        ("shardq_prune", ["--older-than", "9" * 400 + "w"], "--older-than must be from 0 to"),
        ("shardq_prune", ["--batch", "99999999999999999999"], "--batch must be a whole number from 1 to"),
        ("shardq_prune", ["--batch", "9" * 5000], "--batch must be a whole number from 1 to"),
        ("shardq_prune", ["--batch", "0"], "--batch must be a whole number from 1 to"),
        ("shardq_worker", ["--processes", "10000000000"], "--processes must be a whole number from 1 to"),
        ("shardq_worker", ["--grace", "inf"], "--grace must be a number of seconds from 0 to"),
        ("shardq_worker", ["--grace", "nan"], "--grace must be a number of seconds from 0 to"),
        ("shardq_worker", ["--grace", "1e309"], "--grace must be a number of seconds from 0 to"),
        ("shardq_worker", ["--grace", "99999999999"], "--grace must be a number of seconds from 0 to"),
        ("shardq_worker", ["--concurrency", "1000000000"], "--concurrency must be a whole number from 1 to"),
        ("shardq_worker", ["--prefetch", "1000000000000"], "--prefetch must be a whole number from 0 to"),
    ],
)
def test_out_of_range_flags_are_a_command_error_naming_the_flag_and_its_range(db, command, flags, message):
    with pytest.raises(CommandError, match=message):
        call_command(command, *flags)
