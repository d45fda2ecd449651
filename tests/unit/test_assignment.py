"""bench/assignment.py (issue 17, part 5), run small: the properties its table
rests on, for the lease model (shardq's fair share) and the ring it is
compared with."""

import math
import random

import pytest

from bench.assignment import Keys, LeaseTable, Ring, main, names, point, trial


def lease_table(shard_count: int, workers: int, seed: int = 0) -> tuple[LeaseTable, list[str]]:
    rng = random.Random(seed)
    members = names(rng, workers)
    table = LeaseTable(shard_count, rng)
    for worker in members:
        table.join(worker)
    return table, members


def shard_counts(table: LeaseTable) -> dict[str, int]:
    return {w: len(table.holdings[w]) for w in table.live}


@pytest.mark.parametrize("shard_count", [64, 256])
@pytest.mark.parametrize("workers", [1, 3, 4, 5, 16, 17, 63, 64])
def test_the_lease_table_is_the_best_partition_there_is(shard_count, workers):
    table, members = lease_table(shard_count, workers)
    counts = shard_counts(table)
    assert all(owner is not None for owner in table.owner)
    assert sum(counts.values()) == shard_count
    assert max(counts.values()) - min(counts.values()) <= 1
    mean = shard_count / workers
    # No assignment of S whole shards to W workers has a smaller maximum.
    assert max(counts.values()) / mean <= math.ceil(shard_count / workers) / mean
    # The extra shards go to the first workers in start order (fair_share).
    assert [counts[w] for w in members] == sorted(counts.values(), reverse=True)


@pytest.mark.parametrize(("shard_count", "workers"), [(64, 4), (64, 16), (64, 63), (256, 16), (1024, 64)])
def test_a_joiner_takes_exactly_its_share_and_nothing_else_moves(shard_count, workers):
    table, _ = lease_table(shard_count, workers, seed=workers)
    before = list(table.owner)
    joiner = "joiner"
    table.join(joiner)
    moved = [s for s, (b, a) in enumerate(zip(before, table.owner, strict=True)) if b != a]
    assert all(table.owner[s] == joiner for s in moved)
    # The least any scheme moves that leaves shares within one of each other.
    assert len(moved) == shard_count // (workers + 1)
    assert table.rounds <= 2  # part 1: settled within two heartbeats
    counts = shard_counts(table)
    assert max(counts.values()) - min(counts.values()) <= 1


@pytest.mark.parametrize(("shard_count", "workers"), [(64, 4), (64, 16), (64, 64), (256, 17), (1024, 64)])
def test_a_dead_workers_shards_spread_over_the_survivors(shard_count, workers):
    table, members = lease_table(shard_count, workers, seed=workers)
    before = list(table.owner)
    counts_before = shard_counts(table)
    dead = random.Random(workers).choice(members)
    orphaned = counts_before[dead]
    table.die(dead)
    moved = [s for s, (b, a) in enumerate(zip(before, table.owner, strict=True)) if b != a]
    assert sorted(moved) == sorted(s for s, owner in enumerate(before) if owner == dead)
    assert all(owner is not None for owner in table.owner)
    gains = [len(table.holdings[w]) - counts_before[w] for w in table.live]
    assert min(gains) >= 0
    assert max(gains) <= math.ceil(orphaned / (workers - 1))
    assert table.rounds <= 2


def test_the_ring_moves_only_the_joiners_and_the_leavers_shards():
    rng = random.Random(7)
    members = names(rng, 17)
    positions = sorted(point(f"shard:{s}") for s in range(256))
    ring = Ring(100, members[:16])
    before = ring.owners(positions)
    ring.join(members[16])
    joined = ring.owners(positions)
    assert {a for b, a in zip(before, joined, strict=True) if b != a} == {members[16]}
    ring.leave(members[16])
    assert ring.owners(positions) == before
    ring.leave(members[3])
    left = ring.owners(positions)
    assert {b for b, a in zip(before, left, strict=True) if b != a} == {members[3]}


@pytest.mark.parametrize("vnodes", [100, 200])
def test_sixty_four_shards_on_a_ring_leave_some_worker_far_above_the_mean(vnodes):
    """The ring's imbalance at shardq's default shard count: whatever the
    virtual nodes, 64 shard points fall where their hashes put them."""
    positions = sorted(point(f"shard:{s}") for s in range(64))
    for seed in range(5):
        owners = Ring(vnodes, names(random.Random(seed), 16)).owners(positions)
        busiest = max(owners.count(w) for w in set(owners))
        assert busiest / (64 / 16) >= 1.5  # the lease table: exactly 1.0
        lease = trial("lease", 64, 16, Keys(3000), seed)
        assert lease.death.busiest_gain_shards == 1  # 4 orphaned shards over 15 survivors


def test_the_script_prints_the_issues_three_transitions(capsys):
    assert main(["--trials", "2", "--keys", "2000"]) == 0
    out = capsys.readouterr().out
    for change in ("| 64 | 4 → 5 | lease |", "| 64 | 16 → 17 | ring-100 |", "| 64 | 64 → 63 | ring-200 |"):
        assert change in out
    assert "| keys | 64 → 63 | ring-100 |" in out


def test_the_script_refuses_a_trial_count_of_zero(capsys):
    with pytest.raises(SystemExit):
        main(["--trials", "0"])
    assert "--trials and --keys must be at least 1" in capsys.readouterr().err
