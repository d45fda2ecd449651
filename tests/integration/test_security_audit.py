"""The security audit's findings (issue 28 §6), each shown closed: what a
view-only staff user, the Limits page, ``shardq_status``, the log and the
example project give away, and what the backend answers for a job whose
task this process does not define."""

import hashlib

import pytest
from django.test import RequestFactory

from shardq.admin.jobs import FILTERABLE_FIELDS, JobAdmin
from shardq.db.store import ensure_shards
from shardq.models import Job
from tests.browser.rows import VIEW_PERMISSIONS, make_user
from tests.taskapp import audit_tasks, operator_tasks

SECRET = "hunter2-s3cret"
JOBS = "/admin/shardq/job/"


@pytest.fixture
def viewer(client, django_user_model, db):
    user = make_user(django_user_model, "viewer", permissions=VIEW_PERMISSIONS)
    client.force_login(user)
    ensure_shards()
    client.user = user
    return client


def changelist_names(user) -> set[str]:
    """Every name a URL lookup could start with on the job list: the
    model's fields and every annotation of the changelist's queryset."""
    from django.contrib import admin

    model_admin = admin.site._registry[Job]
    assert isinstance(model_admin, JobAdmin)
    request = RequestFactory().get(JOBS)
    request.user = user
    queryset = model_admin.get_queryset(request)
    fields = {f.name for f in Job._meta.get_fields()} | {f.attname for f in Job._meta.concrete_fields}
    return fields | set(queryset.query.annotations) | {"pk"}


# Lookups that would tell a value one guess at a time, for a name whose
# value is text, a JSON document (an argument list, a kwargs object, a
# bounded excerpt's {"value": ...}), or a number.
PATHS = ("", "__value__password", "__password", "__0", "__1", "__value__1", "__token", "__value__0")
LOOKUPS = ("startswith", "icontains")


def listed_ids(response, ids) -> list:
    page = response.content.decode()
    return [i for i in ids if f"{JOBS}{i}/change/" in page]


def changelist_answer(user, params: dict):
    """What the job list answers a URL with ``params``, as Django builds it
    (ChangeList: get_filters, lookup_allowed, the queryset): the ids listed,
    or "refused" (Django's DisallowedModelAdminLookup: a 400)."""
    from django.contrib import admin
    from django.contrib.admin.exceptions import DisallowedModelAdminLookup
    from django.contrib.admin.options import IncorrectLookupParameters

    model_admin = admin.site._registry[Job]
    request = RequestFactory().get(JOBS, params)
    request.user = user
    try:
        changelist = model_admin.get_changelist_instance(request)
        return sorted(changelist.get_queryset(request).values_list("id", flat=True))
    except DisallowedModelAdminLookup:
        return "refused"
    except IncorrectLookupParameters:
        return "incorrect"


def test_no_name_of_the_job_list_lets_a_view_only_user_infer_a_sensitive_value(viewer):
    """Issue 28 §6 (high): ``?id=N&kwargs_bounded__value__password__startswith=h``
    gave 1 row and ``...=z`` 0. Every field and annotation of the list's
    queryset is tried with lookups that would tell a sensitive argument (by
    keyword, by position) or a sensitive shard key: the right guess and a
    wrong one get the same answer; every name off the allow-list is refused."""
    jobs = [
        operator_tasks.log_in.enqueue(account="acct-1", password=SECRET).id,
        operator_tasks.log_in.enqueue("acct-2", SECRET).id,
        operator_tasks.use_token.enqueue(SECRET).id,
    ]
    names = changelist_names(viewer.user)
    assert {"args_bounded", "kwargs_bounded", "kwargs", "args", "shard_key", "key_hash", "limit_keys"} <= names
    tried, leaks, not_refused = 0, [], []
    for name in sorted(names):
        allowed = name in FILTERABLE_FIELDS or name == "pk"
        probes = [(f"{name}{path}__{lookup}", SECRET[:3], "zzz") for path in PATHS for lookup in LOOKUPS]
        if not allowed:
            # A sensitive shard key's hash, an argument that is a number.
            probes.append((f"{name}__gte", "-2147483648", "2147483647"))
        for lookup, right, wrong in probes:
            answers = [changelist_answer(viewer.user, {lookup: guess}) for guess in (right, wrong)]
            tried += 1
            if answers[0] != answers[1]:
                leaks.append((lookup, answers))
            if not allowed and answers[0] != "refused":
                not_refused.append(lookup)
    assert leaks == []
    assert not_refused == []
    assert tried > 300
    # Over HTTP, the requests: a 400 whatever the guess.
    for job, lookup in (
        (jobs[0], "kwargs_bounded__value__password__startswith"),
        (jobs[1], "args_bounded__value__1__startswith"),
    ):
        for guess in ("h", "z"):
            assert viewer.get(JOBS, {"id": job, lookup: guess}).status_code == 400
    # The allowed names still filter (the shard map's and the dashboard's links).
    row = Job.objects.get(pk=int(jobs[2]))
    response = viewer.get(JOBS, {"shard__exact": row.shard, "status__exact": "READY"})
    assert response.status_code == 200 and listed_ids(response, jobs) == [jobs[2]]
    assert SECRET not in response.content.decode()


# -- limit keys ----------------------------------------------------------------


def limit_keys_of(job_id) -> list[str]:
    return Job.objects.values_list("limit_keys", flat=True).get(pk=int(job_id)) or []


@pytest.mark.django_db
def test_a_sensitive_limit_by_value_is_never_written_into_a_limit_key(client, django_user_model):
    """A ``sensitive`` argument used as ``limit_by`` was stored in limit_keys,
    shown on the Limits page (view_limitslot only), printed by
    ``shardq_status`` and filterable. Its key is now a marked, keyed digest
    (HMAC with SECRET_KEY): one per value, so the limit still holds per value."""
    from io import StringIO

    from django.core.management import call_command

    from shardq.limits import limit_report

    ensure_shards()
    first = audit_tasks.call_api.enqueue(account="a", api_token=SECRET)
    same = audit_tasks.call_api.enqueue(account="b", api_token=SECRET)
    other = audit_tasks.call_api.enqueue(account="c", api_token="another-token")
    by_key = audit_tasks.call_api_by_key.enqueue(SECRET)
    keys = [limit_keys_of(job.id) for job in (first, same, other, by_key)]
    assert keys[0] == keys[1] != keys[2]
    assert all(len(k) == 1 and "#hmac:" in k[0] for k in keys), keys
    assert not Job.objects.get(pk=int(by_key.id)).key_limited  # not kept by the shard key's owner: no key shown
    assert SECRET not in str(keys)
    assert SECRET not in str(limit_report())
    out = StringIO()
    call_command("shardq_status", stdout=out)
    assert SECRET not in out.getvalue()
    client.force_login(make_user(django_user_model, "limits", permissions=["view_limitslot"]))
    page = client.get("/admin/shardq/limitslot/")
    assert page.status_code == 200 and SECRET not in page.content.decode()


@pytest.mark.django_db
def test_a_raw_limit_by_value_never_gives_the_key_of_a_hashed_long_one():
    """A raw value ``#sha256:<hex>`` gave the same limit key as the long
    value it hashes: the two calls shared one limit. A hashed key is marked
    (``#`` after the task path, where a raw value has ``=``)."""
    long_value = "x" * 5000
    forged = "#sha256:" + hashlib.sha256(long_value.encode()).hexdigest()
    hashed = audit_tasks.per_customer.enqueue(customer=long_value)
    raw = audit_tasks.per_customer.enqueue(customer=forged)
    assert limit_keys_of(hashed.id) != limit_keys_of(raw.id)
    assert limit_keys_of(hashed.id)[0].startswith(f"t:{audit_tasks.per_customer.module_path}#sha256:")
    assert limit_keys_of(raw.id)[0] == f"t:{audit_tasks.per_customer.module_path}={forged}"


# -- get_result of a task this process does not define -------------------------


def hand_written_job(task_path: str, **columns) -> int:
    from tests.isolation.test_operator_surfaces import insert_job

    return insert_job(task_path=task_path, **columns)


@pytest.mark.django_db
def test_get_result_of_a_job_whose_task_is_not_defined_here_returns_it_on_a_placeholder(db):
    from django.tasks import default_task_backend

    from shardq import UnknownTask
    from shardq.tasks import registered_task_paths, resolve

    ensure_shards()
    path = "tests.taskapp.gone_in_this_release.send_report"
    job_id = hand_written_job(path, kwargs='{"report": 7}', status="SUCCESSFUL", return_value="42")
    result = default_task_backend.get_result(str(job_id))
    assert result.task.module_path == path and result.task.name == "send_report"
    assert (result.status, result.kwargs, result.return_value) == ("SUCCESSFUL", {"report": 7}, 42)
    with pytest.raises(UnknownTask, match=r"gone_in_this_release\.send_report"):
        result.task.enqueue()
    # The placeholder is not a task of this process: nothing registered it.
    assert path not in registered_task_paths()
    with pytest.raises(UnknownTask):
        resolve(path)


@pytest.mark.django_db
def test_the_example_job_page_of_a_task_not_defined_here_is_a_200_for_its_reader(client, django_user_model):
    ensure_shards()
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    client.force_login(staff)
    job_id = hand_written_job("tests.taskapp.gone_in_this_release.send_report", status="READY")
    response = client.get(f"/jobs/{job_id}/")
    assert response.status_code == 200 and response.json()["status"] == "READY"


# -- the example's /jobs/<id>/ -------------------------------------------------


@pytest.mark.django_db
def test_the_example_job_page_shows_a_job_to_its_customer_and_staff_only(client, django_user_model):
    from example_project.demo.tasks import send_receipt

    ensure_shards()
    owner = django_user_model.objects.create_user("owner", password="x")
    stranger = django_user_model.objects.create_user("stranger", password="x")
    staff = django_user_model.objects.create_user("staff", password="x", is_staff=True)
    job = send_receipt.enqueue(customer_id=owner.pk, order_id=1)
    answers = {}
    for user in (owner, stranger, staff):
        client.force_login(user)
        answers[user.username] = client.get(f"/jobs/{job.id}/").status_code
    assert answers == {"owner": 200, "stranger": 404, "staff": 200}


# -- what a failure logs ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_failure_logs_a_bounded_message_with_no_sensitive_value(caplog):
    """A 300 MB exception message reached the worker's log whole through
    task_finished (Django's receiver logs sys.exc_info()), and exception
    messages carry argument values, sensitive ones too. The worker's line,
    Django's record and the stored traceback are bounded and hide them."""
    import logging

    from tests.helpers import in_process_worker, job_row, wait_until

    size = 3_000_000
    with caplog.at_level(logging.INFO):
        job = audit_tasks.fail_loudly.enqueue(account="acct-9", password=SECRET, size=size)
        with in_process_worker(concurrency=1):
            wait_until(lambda: job_row(job.id)["status"] == "FAILED", timeout=20)
    texts = [
        logging.Formatter().format(record)  # with the traceback of exc_info
        for record in caplog.records
        if record.name.startswith(("django.tasks", "shardq"))
    ]
    finished = [t for t in texts if t.startswith(f"Task id={job.id} ") and "FAILED" in t]
    assert finished, texts  # Django's own task_finished record was logged
    assert "ValueError: could not log in acct-9 with" in finished[0]  # what failed is still told
    assert [t for t in texts if SECRET in t] == []
    assert max(map(len, texts)) < 20_000
    [error] = job_row(job.id)["errors"]
    assert error["exception_class_path"] == "builtins.ValueError" and SECRET not in error["traceback"]


# -- silent rows --------------------------------------------------------------------


@pytest.mark.django_db
def test_jobs_no_worker_will_ever_run_are_reported_by_shardq_status_and_the_job_list(viewer):
    """A shard out of range, or WAITING on nothing: such rows sat silently."""
    import json
    from io import StringIO

    from django.core.management import call_command

    from tests.browser.rows import sql

    path = "tests.taskapp.operator_tasks.log_in"
    outside = hand_written_job(path, shard=4000)
    orphan = hand_written_job(path, status="WAITING")
    parent = hand_written_job(path)
    child = hand_written_job(path, status="WAITING", waiting_on=1)
    sql(
        "INSERT INTO shardq_edge (parent, child, name, run_on_failure, resolved) VALUES (%s, %s, 'p', false, false)",
        [parent, child],
    )
    out = StringIO()
    call_command("shardq_status", stdout=out)
    text = out.getvalue()
    assert f"jobs no worker will ever run (shard out of range): 1, e.g. ids {outside} (" in text, text
    assert f"jobs no worker will ever run (WAITING on nothing): 1, e.g. ids {orphan} (" in text, text
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    silent = {row["reason"]: row["ids"] for row in json.loads(out.getvalue())["silent_rows"]}
    assert silent == {"shard out of range": [outside], "WAITING on nothing": [orphan]}
    page = viewer.get(JOBS).content.decode()
    assert f'no worker will ever run (shard out of range): <a href="{JOBS}?id__in={outside}">#{outside}</a>' in page
    assert f'?id__in={orphan}">#{orphan}</a>' in page
    assert viewer.get(JOBS, {"id__in": f"{outside},{orphan}"}).status_code == 200
