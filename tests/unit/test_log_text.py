"""The compact shard lists of the worker's log lines."""

from shardq.worker.logs import shard_ranges


def test_shard_ranges_join_runs_of_consecutive_shards():
    assert shard_ranges([9, 0, 1, 2, 3, 7, 10]) == "0-3,7,9-10"


def test_shard_ranges_of_every_shard_is_one_range():
    assert shard_ranges(range(64)) == "0-63"


def test_shard_ranges_of_one_shard_and_of_none():
    assert shard_ranges({5}) == "5"
    assert shard_ranges([]) == "none"
