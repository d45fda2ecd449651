"""The dashboard's hot-shard rule (HOT_RULE) as a pure function of the shard rows."""

from shardq.admin.dashboard import (
    HOT_DEPTH_FLOOR,
    HOT_P99_FLOOR_SECONDS,
    HOT_P99_MIN_JOBS,
    HOT_WAIT_FLOOR_SECONDS,
    mark_hot_shards,
)


def shard(depth=0, oldest=None, finished=0, p99=None) -> dict:
    return {"depth": depth, "oldest": oldest, "finished": finished, "p99": p99}


def hot(rows) -> list[int]:
    mark_hot_shards(rows)
    return [i for i, r in enumerate(rows) if r["hot_reasons"]]


def test_no_shards_means_no_medians_and_nothing_hot():
    assert mark_hot_shards([]) == (0, 0.0, None)


def test_depth_over_twice_the_median_plus_the_floor_is_hot_and_at_it_is_not():
    rows = [shard(depth=10) for _ in range(5)]
    rows.append(shard(depth=2 * 10 + HOT_DEPTH_FLOOR))  # exactly at the bound
    rows.append(shard(depth=2 * 10 + HOT_DEPTH_FLOOR + 1))
    assert hot(rows) == [6]
    assert rows[6]["hot_reasons"] == [f"READY depth {2 * 10 + HOT_DEPTH_FLOOR + 1} > 2 × 10 + {HOT_DEPTH_FLOOR}"]


def test_a_near_zero_median_does_not_flag_noise():
    rows = [shard() for _ in range(63)] + [shard(depth=HOT_DEPTH_FLOOR, oldest=HOT_WAIT_FLOOR_SECONDS)]
    assert hot(rows) == []


def test_the_oldest_wait_counts_a_shard_with_no_due_job_as_zero():
    rows = [shard(oldest=None) for _ in range(3)] + [shard(oldest=HOT_WAIT_FLOOR_SECONDS + 0.1)]
    assert hot(rows) == [3]
    assert rows[3]["hot_reasons"][0].startswith("oldest READY waits")


def test_p99_is_judged_only_for_shards_that_finished_enough_jobs():
    judged = [shard(finished=HOT_P99_MIN_JOBS, p99=0.01) for _ in range(4)]
    slow_but_few = shard(finished=HOT_P99_MIN_JOBS - 1, p99=60.0)
    slow = shard(finished=HOT_P99_MIN_JOBS, p99=2 * 0.01 + HOT_P99_FLOOR_SECONDS + 0.01)
    rows = [*judged, slow_but_few, slow]
    _, _, median_p99 = mark_hot_shards(rows)
    assert median_p99 == 0.01  # the few-jobs shard is not in the median either
    assert [i for i, r in enumerate(rows) if r["hot_reasons"]] == [5]


def test_every_reason_is_listed():
    rows = [shard(finished=HOT_P99_MIN_JOBS, p99=0.01) for _ in range(5)]
    rows.append(shard(depth=1000, oldest=3600.0, finished=HOT_P99_MIN_JOBS, p99=30.0))
    assert hot(rows) == [5]
    assert len(rows[5]["hot_reasons"]) == 3


def test_every_model_admin_is_read_only_through_one_mixin():
    from django.contrib import admin

    from shardq.admin.common import ReadOnlyMixin

    shardq_admins = [a for m, a in admin.site._registry.items() if m._meta.app_label == "shardq"]
    assert len(shardq_admins) == 8  # the Queues page (shardq/admin/queues.py) and Job history too
    for model_admin in shardq_admins:
        assert isinstance(model_admin, ReadOnlyMixin), type(model_admin)
        assert not model_admin.has_add_permission(None)
        assert not model_admin.has_change_permission(None)
        assert not model_admin.has_delete_permission(None)
