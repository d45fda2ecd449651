"""Fair keys on every enqueue path, their options checked at definition, and
the claim that takes a shard's fair jobs key by key (docs/fairness.md). The
local queue's order is tests/unit/test_fair_queue.py's; the shares across
real workers tests/acceptance/test_fairness.py's."""

import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

import shardq
from shardq import shard_task
from shardq.db.queries import QUERIES
from shardq.db.store import WorkerStore, claim_jobs_params, claim_scope
from shardq.fairness import FairWeights, configured_weights, summarize_fair_keys
from shardq.tasks import validate_shard_options
from shardq.worker.jobs import ClaimedJob
from tests.helpers import leased_shard_factory, sql
from tests.taskapp import fair_tasks as t
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def fair_of(result) -> tuple[str | None, int | None]:
    [row] = sql("SELECT fair_key, fair_weight FROM shardq_job WHERE id = %s", [int(result.id)])
    return row


def test_every_enqueue_path_stores_the_fair_key_and_weight():
    one = t.tenant_job.enqueue("acme")
    many = shardq.enqueue_many(t.tenant_job, [(("globex",), {"n": i}) for i in range(3)])
    weighted = t.tenant_job.using(fair_weight=3).enqueue(tenant="acme")
    weighted_many = shardq.enqueue_many(t.tenant_job.using(fair_weight=2), [(("initech",), {})])
    flow = shardq.Workflow()
    first = flow.add(t.tenant_job, "acme", n=1)
    flow.add(t.tenant_job.using(fair_weight=5), "umbrella", n=2, after=[first])
    graph = flow.enqueue()
    fixed = tasks.noop.using(fair_key="hooli").enqueue()

    assert fair_of(one) == ("acme", None)
    assert [fair_of(r) for r in many] == [("globex", None)] * 3
    assert fair_of(weighted) == ("acme", 3)
    assert fair_of(weighted_many[0]) == ("initech", 2)
    assert [fair_of(r) for r in graph] == [("acme", None), ("umbrella", 5)]
    assert fair_of(fixed) == ("hooli", None)
    # No fair key: the columns stay NULL, the job is claimed as before.
    assert fair_of(tasks.noop.enqueue()) == (None, None)


def test_a_unique_task_stores_its_fair_key():
    from tests.taskapp.tasks import unique_report

    result = unique_report.using(fair_key="acme", fair_weight=2).enqueue(7)
    assert fair_of(result) == ("acme", 2)


def test_a_long_fair_key_is_stored_as_its_hash():
    result = t.tenant_job.enqueue("x" * 500)
    key, _ = fair_of(result)
    assert key.startswith("#sha256:") and len(key) == len("#sha256:") + 64


def test_a_queue_default_fair_key_applies_to_the_tasks_that_have_that_argument():
    from shardq.enqueue.rows import JobRows

    rows = JobRows("default", shardq.conf.get_config(), {}, {"default": "tenant"})
    assert rows.job_row(t.unfair_job, ("acme",), {})["fair_key"] == "acme"
    assert rows.job_row(tasks.noop, (), {})["fair_key"] is None  # no such argument: no fair key
    with override_settings(SHARDQ={"QUEUES": {"reports": {"fair_key": "tenant_id"}}}):
        from shardq.fairness import queue_fair_keys

        assert queue_fair_keys() == {"reports": "tenant_id"}
    with (
        override_settings(SHARDQ={"QUEUES": {"reports": {"fair_key": 3}}}),
        pytest.raises(ImproperlyConfigured, match="fair_key"),
    ):
        queue_fair_keys()


def _report(tenant_id, n=0):
    pass


def check(**options):
    validate_shard_options(shard_task(**options)(_report))


def test_bad_fair_options_fail_at_definition_naming_what_to_do():
    check(fair_key="tenant_id", fair_weight=3, fair_by="time")
    check(fair_key=lambda args, kwargs: kwargs["tenant_id"])
    with pytest.raises(InvalidTask, match="fair_key='tenant' is not an argument"):
        check(fair_key="tenant")
    with pytest.raises(InvalidTask, match="fair_key must be the name of an argument or a callable"):
        check(fair_key=42)
    with pytest.raises(InvalidTask, match="fair_weight must be a whole number"):
        check(fair_key="tenant_id", fair_weight=0)
    with pytest.raises(InvalidTask, match="fair_by must be 'count'"):
        check(fair_key="tenant_id", fair_by="money")
    with pytest.raises(InvalidTask, match=r"using\(fair_weight=...\) must be a whole number"):
        t.tenant_job.using(fair_weight=2.5)


def test_weights_come_from_settings_as_a_mapping_or_a_callable():
    with override_settings(SHARDQ={"FAIRNESS": {"WEIGHTS": {"acme": 3}}}):
        weights = FairWeights(configured_weights())
        assert (weights("acme"), weights("globex")) == (3.0, 1.0)
    with override_settings(SHARDQ={"FAIRNESS": {"WEIGHTS": lambda key: 2 if key == "big" else 1}}):
        weights = FairWeights(configured_weights())
        assert (weights("big"), weights("small")) == (2.0, 1.0)
    with (
        override_settings(SHARDQ={"FAIRNESS": {"WEIGHTS": {"acme": -1}}}),
        pytest.raises(ImproperlyConfigured, match="a weight is a positive number"),
    ):
        configured_weights()


def backlog_on_shard_0(tenant: str, n: int) -> list[int]:
    ids = [int(r.id) for r in shardq.enqueue_many(t.tenant_job, [((tenant,), {"n": i}) for i in range(n)])]
    sql("UPDATE shardq_job SET shard = 0 WHERE id = ANY(%s)", [ids])
    return ids


def claim(worker, limit, **fair):
    store = WorkerStore(application_name="test-fairness")
    try:
        return store.claim_jobs(worker, [0], None, limit, limit, row_factory=ClaimedJob, **fair)
    finally:
        store.close()


def test_once_a_key_is_full_the_claim_takes_each_keys_head_not_a_slice_of_the_first_keys_backlog():
    worker, _ = leased_shard_factory([0])
    noisy = backlog_on_shard_0("noisy", 50)
    [quiet] = backlog_on_shard_0("quiet", 1)

    # No key with two jobs in the worker's memory: a FIFO slice.
    assert [j.id for j in claim(worker, 4, fair_walk=False)] == noisy[:4]
    # Else key by key.
    jobs = claim(worker, 4)

    assert quiet in {j.id for j in jobs}
    assert [j.id for j in jobs if j.fair_key == "noisy"] == noisy[4 : 4 + len(jobs) - 1]


def test_the_claim_passes_over_full_fair_keys_and_walks_the_keys_after_the_last_one_taken():
    worker, _ = leased_shard_factory([0])
    backlog_on_shard_0("a", 20)
    backlog_on_shard_0("b", 20)
    backlog_on_shard_0("c", 20)

    assert {j.fair_key for j in claim(worker, 6, full_fair_keys=["a", "b"])} == {"c"}
    assert {j.fair_key for j in claim(worker, 1, fair_after="a")} == {"b"}


def spread(tenant: str, shards: list[int]) -> list[int]:
    """One job of ``tenant`` on each of ``shards``."""
    ids = [int(r.id) for r in shardq.enqueue_many(t.tenant_job, [((tenant,), {"n": i}) for i in range(len(shards))])]
    sql(
        "UPDATE shardq_job SET shard = s.shard FROM unnest(%s::bigint[], %s::int[]) AS s(id, shard)"
        " WHERE shardq_job.id = s.id",
        [ids, shards],
    )
    return ids


def claim_shards(worker, shards, limit, **fair):
    store = WorkerStore(application_name="test-fairness")
    try:
        return store.claim_jobs(worker, shards, None, 1, limit, row_factory=ClaimedJob, **fair)
    finally:
        store.close()


def test_the_round_takes_each_key_once_across_the_shards_and_the_next_claim_goes_on_after_the_last_key():
    """Tenants whose jobs sit one a shard on many shards (the shard key is
    not the fair key): a walk of each shard's keys took a tenant's job on
    every shard in one pass. The round takes each key once over all the
    worker's shards, and the next claim goes on after the last key taken,
    then round again from the first."""
    worker, _ = leased_shard_factory(range(8))
    tenants = [f"t{i}" for i in range(6)]
    for tenant in tenants:
        spread(tenant, list(range(8)))

    first = claim_shards(worker, list(range(8)), 4)
    assert sorted(j.fair_key for j in first) == ["t0", "t1", "t2", "t3"]
    second = claim_shards(worker, list(range(8)), 4, fair_after="t3")
    # t4 and t5, then round again: t0 and t1.
    assert sorted(j.fair_key for j in second) == ["t0", "t1", "t4", "t5"]
    third = claim_shards(worker, list(range(8)), 12, fair_after="t1")
    # Each key once more, the ones after t1 first, t0 and t1 last.
    assert sorted(j.fair_key for j in third) == sorted(tenants)
    assert len({j.id for j in first + second + third}) == 4 + 4 + 6


def test_the_round_shares_its_batch_out_by_the_weights_the_worker_knows():
    worker, _ = leased_shard_factory([0])
    backlog_on_shard_0("a", 20)
    backlog_on_shard_0("b", 20)
    backlog_on_shard_0("c", 20)

    jobs = claim(worker, 10, fair_weights={"a": 3.0})

    # a: 3/5 of 10; b and c: 1/5 each.
    counts = {key: sum(1 for j in jobs if j.fair_key == key) for key in "abc"}
    assert counts == {"a": 6, "b": 2, "c": 2}


def test_the_round_passes_over_keys_with_no_job_on_the_workers_shards():
    worker, _ = leased_shard_factory([0, 1, 2, 3])
    spread("a", [4, 5, 6, 7] * 5)  # only on shards another worker holds
    spread("b", [6, 3])
    spread("c", [5, 1, 7])

    jobs = claim_shards(worker, [0, 1, 2, 3], 10)

    assert sorted((j.fair_key, j.shard) for j in jobs) == [("b", 3), ("c", 1)]


def test_jobs_without_a_fair_key_are_claimed_as_before_beside_fair_ones():
    worker, _ = leased_shard_factory([0])
    backlog_on_shard_0("a", 10)
    plain = [int(r.id) for r in shardq.enqueue_many(tasks.noop, [((), {}) for _ in range(5)])]
    sql("UPDATE shardq_job SET shard = 0 WHERE id = ANY(%s)", [plain])

    # The fair round takes half the batch while jobs without a key are due
    # too; those come in their own order for the rest.
    jobs = claim(worker, 10)

    assert [j.id for j in jobs if j.fair_key is None] == plain
    assert len([j for j in jobs if j.fair_key == "a"]) == 5


def explain(params):
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["claim_jobs"], params)
        document = cursor.fetchone()[0]
    return document[0]["Plan"] if isinstance(document, list) else __import__("json").loads(document)[0]["Plan"]


def nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def test_the_fair_walk_probes_shardq_job_fair_idx_and_sorts_no_backlog():
    """A 60,000-job backlog over 64 shards, two thirds of it of 200 fair
    keys, analyzed: the claim walks the other third as before, and the
    claim finds each shard's keys and their heads on shardq_job_fair_idx,
    and sorts nothing of shardq_job."""
    worker, _ = leased_shard_factory(list(range(64)))
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard,
                key_hash, ordered, status, status_rank, fence, attempts, max_attempts,
                args, kwargs, errors, worker_ids, enqueued_at, fair_key)
            SELECT 'tests.taskapp.fair_tasks.tenant_job', 'default', 'default', 0,
                   clock_timestamp() - make_interval(secs => g % 3600), g % 64, g, false, 'READY',
                   0, 0, 0, 1, '[]'::jsonb, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, clock_timestamp(),
                   CASE WHEN g % 3 = 0 THEN NULL ELSE 't' || (g % 200) END
            FROM generate_series(1, 60000) AS g
            """
        )
        cursor.execute("ANALYZE shardq_job")
    params = {
        **claim_scope(str(worker), list(range(64)), "*", ["default"], None, "default", 4),
        **claim_jobs_params(128, fair_after="t5", full_fair_keys=["t7"]),
    }

    plan = explain(params)

    scans = [n for n in nodes(plan) if n.get("Relation Name") == "shardq_job"]
    assert "shardq_job_fair_idx" in {n.get("Index Name") for n in scans}, scans
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), scans
    sorts = [n for n in nodes(plan) if n["Node Type"] in {"Sort", "Incremental Sort"}]
    assert not [s for s in sorts if any(n.get("Relation Name") == "shardq_job" for n in nodes(s))]


def seven_tenants_one_of_whose_jobs_ran_20_s_and_one_just_started():
    for i, tenant in enumerate(["big", "mid", "k1", "k2", "k3", "k4", "k5"]):
        shardq.enqueue_many(t.tenant_job, [((tenant,), {}) for _ in range(20 - i)])
    # One of "big"'s ran 20 s in the last minute; one of "mid"'s started just
    # now. big's share of the worker time stays above 0.9 while mid's run,
    # counted up to the moment a test reads it, is under 2.2 s (at 2 s for
    # big, 0.22 s: a test at load 5 read 0.842).
    sql(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', last_attempted_at = clock_timestamp() - interval '21 s',"
        " finished_at = clock_timestamp() - interval '1 s' WHERE id = (SELECT min(id) FROM shardq_job WHERE fair_key = 'big')"
    )
    sql(
        "UPDATE shardq_job SET status = 'RUNNING', last_attempted_at = clock_timestamp()"
        " WHERE id = (SELECT min(id) FROM shardq_job WHERE fair_key = 'mid')"
    )


def test_shardq_status_shows_each_queues_top_fair_keys_and_the_rest_as_other():
    import io
    import json

    from django.core.management import call_command

    seven_tenants_one_of_whose_jobs_ran_20_s_and_one_just_started()
    out = io.StringIO()
    call_command("shardq_status", "--json", stdout=out)

    [queue] = json.loads(out.getvalue())["fair_keys"]
    keys = {k["key"]: k for k in queue["keys"]}
    assert queue["queue"] == "default"
    assert list(keys) == ["big", "mid", "k1", "k2", "k3", "other"]
    assert keys["big"]["backlog"] == 19 and keys["other"]["backlog"] == 15 + 14
    assert keys["big"]["starts_share"] == 0.5 and keys["mid"]["starts_share"] == 0.5
    assert keys["big"]["time_share"] > 0.9
    assert keys["k1"]["oldest_seconds"] >= 0
    text = io.StringIO()
    call_command("shardq_status", stdout=text)
    assert "fair keys of queue default: big 19 waiting" in text.getvalue()


def test_the_admin_dashboard_shows_each_queues_top_fair_keys_and_the_rest_as_other(admin_client):
    from django.urls import reverse

    seven_tenants_one_of_whose_jobs_ran_20_s_and_one_just_started()

    page = admin_client.get(reverse("admin:shardq_dashboard_changelist")).content.decode()

    rows = re.findall(r'<tr data-queue="default" data-key="([^"]+)">(.*?)</tr>', page, re.S)
    assert [key for key, _ in rows] == ["big", "mid", "k1", "k2", "k3", "other"]
    cells = dict(rows)
    assert re.search(r'data-col="backlog">19<', cells["big"]) and re.search(r'data-col="backlog">29<', cells["other"])
    assert 'data-col="starts" data-share="0.5">50 %' in cells["big"]
    assert 'data-col="starts" data-share="0.5">50 %' in cells["mid"]
    assert 'data-col="starts" data-share="0.0">0 %' in cells["k1"]


def test_the_dashboard_says_so_when_no_job_has_a_fair_key(admin_client):
    from django.urls import reverse

    tasks.noop.enqueue()

    page = admin_client.get(reverse("admin:shardq_dashboard_changelist")).content.decode()

    assert 'id="no-fair-keys"' in page and 'id="fair-keys"' not in page


def fair_gauges(registry):
    from shardq.worker import metrics
    from shardq.worker.gauges import Gauges

    m = metrics.Metrics(registry, multiprocess=False)
    store = WorkerStore(application_name="fair-gauges")
    return m, Gauges(store, m, sample=lambda: (0, 0, 0), cluster_seconds=1, lease_ttl_seconds=10, shard_count=64)


def test_the_metrics_holder_exports_each_queues_top_fair_keys_and_the_rest_as_other():
    from prometheus_client import CollectorRegistry

    seven_tenants_one_of_whose_jobs_ran_20_s_and_one_just_started()
    registry = CollectorRegistry()
    _, gauges = fair_gauges(registry)
    try:
        gauges.sample_cluster()

        def value(name, key):
            return registry.get_sample_value(name, {"queue": "default", "fair_key": key})

        keys = {
            s.labels["fair_key"]
            for family in registry.collect()
            if family.name == "shardq_fair_key_backlog"
            for s in family.samples
        }
        assert keys == {"big", "mid", "k1", "k2", "k3", "other"}
        assert value("shardq_fair_key_backlog", "big") == 19
        assert value("shardq_fair_key_backlog", "other") == 15 + 14
        assert value("shardq_fair_key_starts_share", "mid") == 0.5
        assert value("shardq_fair_key_time_share", "big") > 0.9
        assert value("shardq_fair_key_oldest_wait_seconds", "k1") >= 0

        sql("DELETE FROM shardq_job WHERE fair_key = 'big'")  # big's backlog gone: out of the top, at 0
        gauges.sample_cluster()
        assert value("shardq_fair_key_backlog", "big") == 0
        assert value("shardq_fair_key_backlog", "k4") == 15
    finally:
        gauges.store.close()


def test_the_fair_key_label_names_a_bounded_number_of_keys_as_the_top_keys_change():
    from prometheus_client import CollectorRegistry

    from shardq.worker.metrics import MAX_FAIR_KEY_LABELS

    m, gauges = fair_gauges(CollectorRegistry())
    gauges.store.close()
    # Each round a new key tops the queue (3,000 jobs waiting), the others as before.
    for n in range(MAX_FAIR_KEY_LABELS + 50):
        m.fair_sample(
            summarize_fair_keys([("default", f"tenant-{n}", 3000, 1.0, 1, 1.0), ("default", "steady", 5, 1.0, 1, 1.0)])
        )

    names = {labels[1] for labels in m._fair_labels}
    assert len(names) == MAX_FAIR_KEY_LABELS + 1  # the names, then "other"
    assert "other" in names and f"tenant-{MAX_FAIR_KEY_LABELS + 49}" not in names
    assert m.fair_backlog.labels("default", "other")._value.get() == 3000
