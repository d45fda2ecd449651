"""Limit options (docs/limits.md): every bad one is refused where it is
written, with a message saying what to write; good ones put the right
limit keys on the job row, by every enqueue path."""

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.tasks.exceptions import InvalidTask

import shardq
from shardq import shard_task
from shardq.limits import queue_limits
from shardq.tasks import validate_shard_options
from tests.taskapp import limit_tasks

pytestmark = pytest.mark.django_db


def _f(customer, n=0):
    return n


def check(**options):
    validate_shard_options(shard_task(**options)(_f))


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "3", 100_001, None.__class__])
def test_a_bad_max_concurrency_fails_at_definition(value):
    with pytest.raises(InvalidTask, match=r"max_concurrency must be a whole number of jobs from 1 to 100000"):
        check(max_concurrency=value)


@pytest.mark.parametrize("value", ["100", "0/s", "-5/s", "10/day", "1.5/s", "ten/s", "", "5/s/s", "2000000/s"])
def test_a_bad_rate_limit_fails_at_definition_naming_the_forms(value):
    with pytest.raises(InvalidTask, match=r"_f: rate_limit="):
        check(rate_limit=value)


@pytest.mark.parametrize("value", [100, 2.5, ("10", "s"), b"10/s"])
def test_a_rate_limit_that_is_not_text_fails_at_definition(value):
    with pytest.raises(InvalidTask, match=r"rate_limit must be a string like '100/s' or '1000/m'"):
        check(rate_limit=value)


def test_limit_by_needs_a_limit_to_apply():
    with pytest.raises(InvalidTask, match=r"has nothing to apply per value: add max_concurrency=N"):
        check(limit_by="customer")


def test_limit_by_must_name_an_argument():
    with pytest.raises(InvalidTask, match=r"limit_by='client' is not an argument of the function"):
        check(limit_by="client", max_concurrency=2)


@pytest.mark.parametrize("value", [3, 2.5, ["customer"]])
def test_limit_by_must_be_a_name_or_a_callable(value):
    with pytest.raises(InvalidTask, match=r"limit_by must be the name of an argument or a callable"):
        check(limit_by=value, max_concurrency=2)


def test_salt_with_limit_by_of_the_key_is_defined_and_allowed():
    # Documented: the limit is held per value in PostgreSQL, across the
    # shards the salted key is spread over.
    check(key="customer", salt=4, limit_by="customer", max_concurrency=2)


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({"emails": {"max_concurrency": 0}}, r"SHARDQ\[\"QUEUES\"\]\['emails'\]\['max_concurrency'\] must be"),
        ({"emails": {"rate_limit": "fast"}}, r"SHARDQ\[\"QUEUES\"\]\['emails'\]\['rate_limit'\]='fast' is not a rate"),
        ({"emails": {"max_concurency": 3}}, r"unknown option\(s\) 'max_concurency': a queue takes max_concurrency"),
        ({"emails": 20}, r"must be a dict like"),
        ({"": {}}, r"a queue name must be a non-empty str"),
        ("emails", r"must be a list of queue names or a dict"),
        ([1, 2], r"as a list must hold queue names"),
    ],
)
def test_bad_queue_limits_are_refused_with_the_queue_named(settings, queues, message):
    settings.SHARDQ = {**settings.SHARDQ, "QUEUES": queues}
    with pytest.raises(ImproperlyConfigured, match=message):
        queue_limits()


def test_queues_as_a_list_keep_working_and_have_no_limits(settings):
    settings.SHARDQ = {**settings.SHARDQ, "QUEUES": ["default", "emails"]}
    assert queue_limits() == {}


def test_a_bad_queue_limit_stops_the_app_at_start(settings):
    from django.apps import apps

    settings.SHARDQ = {**settings.SHARDQ, "QUEUES": {"emails": {"rate_limit": "50/fortnight"}}}
    with pytest.raises(ImproperlyConfigured, match=r"'50/fortnight' is not a rate"):
        apps.get_app_config("shardq").ready()


def limit_keys_of(ids) -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT limit_keys FROM shardq_job WHERE id = ANY(%s) ORDER BY id", [ids])
        return [row[0] if not isinstance(row[0], str) else json.loads(row[0]) for row in cursor.fetchall()]


def test_every_enqueue_path_stores_the_jobs_limit_keys():
    path = limit_tasks.two_per_customer.module_path
    one = limit_tasks.two_per_customer.enqueue(customer="acme")
    many = shardq.enqueue_many(limit_tasks.two_per_customer, [((), {"customer": "globex"}), (("acme",), {})])
    task = limit_tasks.three_at_once.enqueue()
    plain = limit_tasks.unlimited_sleep.enqueue()
    ids = [int(r.id) for r in (one, *many, task, plain)]
    assert limit_keys_of(ids) == [
        [f"t:{path}=acme"],
        [f"t:{path}=globex"],
        [f"t:{path}=acme"],
        [f"t:{limit_tasks.three_at_once.module_path}"],
        None,
    ]


def test_a_queue_limit_applies_to_every_task_of_the_queue(settings):
    settings.SHARDQ = {**settings.SHARDQ, "QUEUES": {"default": {"max_concurrency": 5, "rate_limit": "50/s"}}}
    job = limit_tasks.three_at_once.enqueue()
    plain = limit_tasks.unlimited_sleep.enqueue()
    many = shardq.enqueue_many(limit_tasks.unlimited_sleep, [((), {})])
    assert limit_keys_of([int(job.id), int(plain.id), int(many[0].id)]) == [
        ["q:default", f"t:{limit_tasks.three_at_once.module_path}"],
        ["q:default"],
        ["q:default"],
    ]


def test_a_limit_by_callable_gives_the_partition_and_a_value_that_is_not_json_is_refused_at_enqueue():
    job = limit_tasks.by_region.enqueue(region="eu")
    assert limit_keys_of([int(job.id)]) == [[f"t:{limit_tasks.by_region.module_path}=eu"]]
    with pytest.raises(
        InvalidTask,
        match=r"by_region: the limit_by value returned by limit_by=_region = <object object .*> cannot be a limit key",
    ):
        limit_tasks.by_region.enqueue(region="broken")
    assert limit_keys_of([int(job.id) + 1]) == []  # nothing stored


def test_a_long_limit_by_value_is_kept_short_as_a_digest():
    job = limit_tasks.two_per_customer.enqueue(customer="x" * 5000)
    (keys,) = limit_keys_of([int(job.id)])
    assert keys[0].startswith("t:" + limit_tasks.two_per_customer.module_path + "#sha256:") and len(keys[0]) < 200
