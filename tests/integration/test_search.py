"""Tags and search by arguments (issue 27 §2): ``@shard_task(tags=...)`` and
``.using(tags=...)`` stored on the row, ``shardq.jobs(...)`` from Python,
the admin's ``customer_id=7`` search and tag filter, the bounded count of the
job list, and ``manage.py shardq_jobs --tag``."""

import html
import re
from io import StringIO

import pytest
from django.contrib.admin.sites import site
from django.core.management import call_command
from django.tasks.exceptions import InvalidTask

import shardq
from shardq import enqueue_many, shard_task
from shardq.admin.paginator import EXACT_BELOW, EstimatedCountPaginator
from shardq.models import Job
from tests.helpers import job_row, sql
from tests.taskapp.admin_tasks import charge, ship

pytestmark = pytest.mark.django_db


def tagged(*, n: int) -> None: ...


def test_tags_are_checked_when_the_task_is_defined_and_at_using():
    with pytest.raises(InvalidTask, match=r"tags must be a list of strings .*not 'billing'"):
        shard_task(tags="billing")(tagged)
    with pytest.raises(InvalidTask, match="must not be empty"):
        shard_task(tags=["ok", " "])(tagged)
    with pytest.raises(InvalidTask, match="over 100; a tag is a short label"):
        charge.using(tags=["x" * 101])
    with pytest.raises(InvalidTask, match=r"using\(tags=...\): each tag must be a string, not 7"):
        charge.using(tags=[7])
    assert shard_task(tags=["b", "a", "b"])(tagged).tags == ("a", "b")
    assert charge.using(tags=["urgent"]).tags == ("urgent",)


def test_a_job_stores_its_tasks_tags_or_the_calls_own_on_every_enqueue_path():
    one = charge.enqueue(customer_id=1)
    own = charge.using(tags=["urgent", "billing"]).enqueue(customer_id=2)
    plain = ship.enqueue(order_id=3)
    many = enqueue_many(charge.using(tags=["bulk"]), [((), {"customer_id": i}) for i in range(3)])

    def tags(result):
        return Job.objects.get(id=result.id).tags

    assert tags(one) == ["billing"]
    assert tags(own) == ["billing", "urgent"]
    assert tags(plain) is None  # in no tag index
    assert [tags(r) for r in many] == [["bulk"]] * 3


def test_jobs_finds_by_task_argument_value_tag_status_and_queue_newest_first():
    first = charge.enqueue(customer_id=7, amount=10)
    charge.enqueue(customer_id=8, amount=10)
    second = charge.using(tags=["vip"]).enqueue(customer_id=7, amount=20)
    ship.enqueue(order_id=7)
    found = shardq.jobs(charge, where={"customer_id": 7})
    assert [j.id for j in found] == [int(second.id), int(first.id)]
    assert [j.id for j in shardq.jobs("tests.taskapp.admin_tasks.charge", where={"customer_id": 7, "amount": 20})] == [
        int(second.id)
    ]
    assert [j.id for j in shardq.jobs(where={"customer_id": 7}, tags=["vip"])] == [int(second.id)]
    assert shardq.jobs(charge, where={"customer_id": "7"}).count() == 0  # JSON: 7 is not "7"
    assert shardq.jobs(charge, status="READY", queue="default").count() == 3
    assert shardq.jobs(charge, status=["FAILED"]).count() == 0
    assert shardq.jobs(tags=["billing"]).count() == 2  # the vip call's tags replace the task's


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"where": {}}, "where must be a non-empty dict"),
        ({"where": [("customer_id", 7)]}, "where must be a non-empty dict"),
        ({"where": {"customer_id": object()}}, "the values must be JSON"),
        ({"where": {"customer_id": float("nan")}}, "the values must be JSON"),
        (
            {"task": charge, "where": {"customer": 7}},
            "'customer' is not an argument of tests.taskapp.admin_tasks.charge",
        ),
        ({"status": "DONE"}, "'DONE' is not a job status"),
        ({"tags": "billing"}, "tags=...) must be a list of strings"),
        ({"task": 7}, "task must be a task or its module path"),
    ],
)
def test_jobs_refuses_a_bad_filter_saying_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        shardq.jobs(**kwargs)


def changelist(rf, user, url: str) -> str:
    request = rf.get(url)
    request.user = user
    from django.contrib.messages.storage.fallback import FallbackStorage

    request.session = {}
    request._messages = FallbackStorage(request)
    response = site._registry[Job].changelist_view(request)
    response.render()
    return html.unescape(response.content.decode())


def listed(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<th class="field-id"><a href="[^"]*">(\d+)</a>', page)]


def test_the_admin_searches_a_keyword_arguments_value_never_a_sensitive_one(rf, admin_user):
    seven = charge.enqueue(customer_id=7, card="4111")
    as_text = charge.enqueue(customer_id="7")
    charge.enqueue(customer_id=8, card="4111")
    for term in ("customer_id=7", "args.customer_id=7", "kwargs.customer_id = 7"):
        assert listed(changelist(rf, admin_user, f"/admin/shardq/job/?q={term}")) == [int(as_text.id), int(seven.id)]
    assert listed(changelist(rf, admin_user, '/admin/shardq/job/?q=customer_id="7"')) == [int(as_text.id)]
    # A match would confirm a guessed card number: charge's jobs are left
    # out of a search on card (other tasks' card arguments would be searched).
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?q=card=4111")) == []
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?q=card=%224111%22")) == []


def test_the_admin_search_finds_an_id_an_exact_shard_key_and_a_task_path(rf, admin_user):
    shipped = ship.enqueue(order_id=42)
    charged = charge.enqueue(customer_id=43)
    assert listed(changelist(rf, admin_user, f"/admin/shardq/job/?q={shipped.id}")) == [int(shipped.id)]
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?q=43")) == [int(charged.id)]  # its key
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?q=admin_tasks.sh")) == [int(shipped.id)]


@pytest.mark.parametrize("length", [1, 2_704, 8_000, 100_000])
def test_a_shard_key_of_any_length_is_enqueued_and_found_by_the_admin_search(rf, admin_user, length):
    # A btree index refuses an entry over 2,704 bytes: the key's index is a
    # hash index, so no key the enqueue accepts makes its INSERT fail.
    # Incompressible (PostgreSQL compresses a long entry before it measures it).
    key = "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(length))
    charged = charge.enqueue(customer_id=key)
    charge.enqueue(customer_id=key[:-1] + "x")
    assert job_row(charged.id)["shard_key"] == key
    # The whole page up to 8,000 characters; past that its rows alone: every
    # link of the page carries the query (the filters', the sort headers',
    # each row's), and rendering 100,000 of them ~200 times took 11 s.
    page = changelist(rf, admin_user, f"/admin/shardq/job/?q={key}") if length <= 8_000 else None
    assert listed(page or result_rows(rf, admin_user, f"/admin/shardq/job/?q={key}")) == [int(charged.id)]


def result_rows(rf, user, url: str) -> str:
    """The job list's rows as its page renders them (``{% result_list %}``
    over the ChangeList the view builds, the same search and queryset),
    without the rest of the page."""
    from django.contrib.admin.templatetags.admin_list import result_list

    request = rf.get(url)
    request.user = user
    rows = result_list(site._registry[Job].get_changelist_instance(request))["results"]
    return html.unescape("".join(str(cell) for row in rows for cell in row))


def test_the_admin_filters_by_tag_and_shows_the_tags(rf, admin_user):
    billed = charge.enqueue(customer_id=1)
    vip = charge.using(tags=["vip"]).enqueue(customer_id=2)
    ship.enqueue(order_id=3)
    page = changelist(rf, admin_user, "/admin/shardq/job/?tag=billing")
    assert listed(page) == [int(billed.id)]
    assert 'class="shardq-tag" href="/admin/shardq/job/?tag=billing"' in page
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?tag=vip")) == [int(vip.id)]


def test_the_job_list_counts_exactly_what_is_small_and_estimates_the_rest():
    charge.enqueue(customer_id=1)
    paginator = EstimatedCountPaginator(Job.objects.order_by("-id"), 100)
    assert (paginator.count, paginator.estimated) == (1, False)
    sql(
        """INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered,
               status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at)
           SELECT 'x.y', 'default', 'default', 0, now(), 0, 0, false, 'SUCCESSFUL', 0, 0, 1, 1, '[]', '{}', '[]',
                  '[]', now() FROM generate_series(1, %s)""",
        [EXACT_BELOW * 30],
    )
    sql("ANALYZE shardq_job")
    paginator = EstimatedCountPaginator(Job.objects.order_by("-id"), 100)
    assert paginator.estimated is False  # until counted
    assert paginator.count > EXACT_BELOW and paginator.estimated
    assert abs(paginator.count - (EXACT_BELOW * 30 + 1)) < EXACT_BELOW * 5  # the planner's, from ANALYZE
    # Stale statistics (the archiver or a prune deleted most rows, no ANALYZE
    # since): the planner still says 30,000, the list counts what is there.
    sql("DELETE FROM shardq_job WHERE task_path = 'x.y'")
    paginator = EstimatedCountPaginator(Job.objects.order_by("-id"), 100)
    assert (paginator.count, paginator.estimated) == (1, False)


def test_shardq_jobs_command_acts_on_a_tag(admin_user):
    billed = charge.enqueue(customer_id=1)
    ship.enqueue(order_id=2)
    out = StringIO()
    call_command("shardq_jobs", "cancel", "--tag", "billing", "--dry-run", stdout=out)
    assert "1 jobs would be cancelled (tag=billing)" in out.getvalue()
    call_command("shardq_jobs", "cancel", "--tag", "billing", "--no-progress", stdout=StringIO())
    assert job_row(billed.id)["status"] == "FAILED"
    assert Job.objects.filter(status="READY").count() == 1


def test_an_argument_search_finds_jobs_in_every_status():
    ids = {
        status: int(charge.enqueue(customer_id=9).id)
        for status in ("READY", "CLAIMED", "RUNNING", "WAITING", "SUSPENDED", "SUCCESSFUL", "FAILED")
    }
    for status, job_id in ids.items():
        sql("UPDATE shardq_job SET status = %s WHERE id = %s", [status, job_id])
    assert {j.id: j.status for j in shardq.jobs(charge, where={"customer_id": 9})} == {v: k for k, v in ids.items()}


def test_the_keyword_argument_index_leaves_out_jobs_in_flight_which_a_search_still_finds(rf, admin_user):
    """shardq_job_kwargs_idx holds no CLAIMED or RUNNING version (a claim and
    a start write no entry of it); shardq.jobs(where=...) and the admin's
    search find such jobs all the same, through shardq_job_inflight_idx, and
    the history's search is the plain containment test."""
    predicate = sql(
        "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'shardq_job_kwargs_idx'::regclass"
    )
    assert (
        predicate[0][0] and "CLAIMED" in predicate[0][0] and "RUNNING" in predicate[0][0] and "NOT" in predicate[0][0]
    )
    ids = {status: int(charge.enqueue(customer_id=11).id) for status in ("READY", "CLAIMED", "RUNNING", "FAILED")}
    other = int(charge.enqueue(customer_id=12).id)
    for status, job_id in ids.items():
        sql("UPDATE shardq_job SET status = %s WHERE id = %s", [status, job_id])
    sql("UPDATE shardq_job SET status = 'RUNNING' WHERE id = %s", [other])
    newest_first = sorted(ids.values(), reverse=True)
    assert [j.id for j in shardq.jobs(where={"customer_id": 11})] == newest_first
    assert [j.id for j in shardq.jobs(charge, where={"customer_id": 11}, status=["CLAIMED", "RUNNING"])] == sorted(
        [ids["CLAIMED"], ids["RUNNING"]], reverse=True
    )
    assert shardq.jobs(where={"customer_id": 11}).count() == 4
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?q=customer_id=11")) == newest_first
    assert listed(changelist(rf, admin_user, "/admin/shardq/job/?q=customer_id=12")) == [other]


def test_the_history_search_by_argument_is_the_plain_containment_test():
    from shardq.models import JobHistory
    from shardq.search import argument_filter

    statement = str(
        JobHistory.objects.filter(argument_filter([{"customer_id": 7}, {"customer_id": "7"}], JobHistory)).query
    )
    assert statement.count('"kwargs" @>') == 2 and "ANY(ARRAY" not in statement
    with pytest.raises(ValueError, match="at least one where"):
        argument_filter([], Job)
