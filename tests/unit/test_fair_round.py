"""The fetcher's side of the claim's fair round (shardq/core/fairround.py):
the turn it hands the next claim, when the claim goes by the round, and the
weights it shares out by. The claim's own walk is
tests/integration/test_fairness.py's."""

from hypothesis import given
from hypothesis import strategies as st

from shardq.core.fairround import FairRound


def round_takes(keys: list[str], after: str, n: int) -> list[str]:
    """What the claim's round takes of ``keys`` (each with a backlog on the
    worker's shards): up to ``n`` keys after ``after`` in byte order, then
    from the first key again up to ``after`` (claim_fair)."""
    ordered = sorted(set(keys))
    return ([k for k in ordered if k > after] + [k for k in ordered if k <= after])[:n]


@given(
    keys=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=30, unique=True),
    batches=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=40),
)
def test_over_any_claims_the_round_serves_every_key_within_one_of_the_others(keys, batches):
    """Keys with endless backlogs, claims of any sizes: the turn handed on
    makes every key's count of claims within one of every other's, however
    the claims cut the round (any text: code point order is the index's
    byte order)."""
    fair = FairRound()
    served = dict.fromkeys(keys, 0)
    for n in batches:
        taken = round_takes(keys, fair.after, n)
        for key in taken:
            served[key] += 1
        fair.claimed([(key, 1.0) for key in taken], walked=True)
        assert max(served.values()) - min(served.values()) <= 1, served


def test_the_round_runs_from_the_start_and_stops_after_memory_jobs_with_no_key_twice():
    fair = FairRound(memory=10)
    assert fair.due
    fair.claimed([(f"k{i}", 1.0) for i in range(6)], walked=True)
    assert fair.due
    fair.claimed([(f"k{i}", 1.0) for i in range(6, 10)], walked=True)
    # Ten fair jobs, ten keys: every job its own key, FIFO slices serve it.
    assert not fair.due
    fair.claimed([("n0", 1.0), ("n1", 1.0)], walked=False)
    assert not fair.due


def test_a_key_that_comes_again_puts_the_claim_back_on_the_round_for_memory_jobs():
    fair = FairRound(memory=4)
    fair.claimed([("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)], walked=False)
    assert not fair.due
    fair.claimed([("e", 1.0), ("a", 1.0)], walked=False)  # a came again
    assert fair.due
    fair.claimed([("f", 1.0), ("g", 1.0), ("h", 1.0), ("i", 1.0)], walked=True)
    assert not fair.due
    # A key in one claim twice counts too.
    fair.claimed([("j", 1.0), ("j", 1.0)], walked=False)
    assert fair.due


def test_the_weights_other_than_1_of_the_keys_claimed_lately_are_kept():
    fair = FairRound(memory=3)
    fair.claimed([("a", 3.0), ("b", 1.0), ("c", 0.5)], walked=True)
    assert fair.weights == {"a": 3.0, "c": 0.5}
    fair.claimed([("c", 1.0)], walked=True)  # its weight is 1 now
    assert fair.weights == {"a": 3.0}
    fair.claimed([("d", 1.0), ("e", 1.0), ("f", 1.0)], walked=True)
    # a is out of the last 3 keys claimed: forgotten.
    assert fair.weights == {}


def test_the_turn_is_the_last_key_taken_past_the_wrap():
    fair = FairRound()
    fair.claimed([("b", 1.0), ("c", 1.0)], walked=True)
    assert fair.after == "c"
    # After c: d, then round again: a.
    fair.claimed([("d", 1.0), ("a", 1.0)], walked=True)
    assert fair.after == "a"
    # A claim by FIFO slices does not move the turn.
    fair.claimed([("z", 1.0)], walked=False)
    assert fair.after == "a"
