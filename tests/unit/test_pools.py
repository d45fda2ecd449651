"""Pool names: one canonical name per worker selection, parsed back by pool_serves."""

from hypothesis import given
from hypothesis import strategies as st

from shardq.core.pools import pool_name, pool_serves

# Names a worker can serve: no "," or "@" (pool syntax), not starting with
# "*" (every queue; refused, see the test below).
queue_names = st.text(
    alphabet=st.characters(blacklist_characters=",@", blacklist_categories=("Cs",)), min_size=1
).filter(lambda name: not name.startswith("*"))


def test_a_queue_name_starting_with_the_star_is_refused():
    import pytest

    for selection in (["*"], ["*-emails"], ["default", "*x"]):
        with pytest.raises(ValueError, match="names every queue"):
            pool_name(selection)
    with pytest.raises(ValueError, match="names every queue"):
        pool_name(None, ["*"])


def test_no_flags_is_the_star_pool():
    assert pool_name(None) == "*"
    assert pool_name([], [], "default") == "*"


def test_names_are_canonical():
    assert pool_name(["reports", "default"]) == pool_name(["default", "reports", "default"]) == "default,reports"
    assert pool_name(None, ["emails", "b"]) == "*-b,emails"
    assert pool_name(["emails"], backend="other") == "emails@other"


def test_pool_serves_its_queues_only():
    assert pool_serves("*", "anything")
    assert pool_serves("default,reports", "reports")
    assert not pool_serves("default,reports", "emails")
    assert not pool_serves("*-emails", "emails")
    assert pool_serves("*-emails", "default")
    assert not pool_serves("*@other", "default")
    assert pool_serves("*@other", "default", backend="other")
    assert not pool_serves("emails", "emails", backend="other")


@given(st.lists(queue_names, max_size=5), st.lists(queue_names, max_size=3), queue_names)
def test_name_parses_back(queues, excluded, queue):
    """pool_serves(pool_name(selection), q) is exactly "the selection serves q"."""
    if queues:
        expected = queue in queues
    else:
        expected = queue not in excluded
    assert pool_serves(pool_name(queues, excluded), queue) == expected
