"""shardq.core.tags: what ``@shard_task(tags=...)`` and ``.using(tags=...)``
accept, as properties over generated values."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.core.tags import MAX_TAG_CHARS, MAX_TAGS, normalize_tags

good_tag = st.text(
    alphabet=st.characters(min_codepoint=32, blacklist_categories=("Cs",), blacklist_characters="\x7f"),
    min_size=1,
    max_size=MAX_TAG_CHARS,
).filter(str.strip)


@given(st.lists(good_tag, max_size=MAX_TAGS))
def test_good_tags_come_back_sorted_and_without_duplicates(tags):
    assert normalize_tags(tags) == tuple(sorted(set(tags)))
    assert normalize_tags(normalize_tags(tags)) == normalize_tags(tags)  # idempotent
    assert normalize_tags(reversed(tags)) == normalize_tags(tags)  # order does not matter


@given(
    st.lists(good_tag, min_size=1, max_size=MAX_TAGS), st.sampled_from(["", "  ", "a\tb", "a\nb", "x" * 101, 7, None])
)
def test_one_bad_tag_refuses_the_whole_list_naming_where(tags, bad):
    with pytest.raises(ValueError, match=r"^app\.task: tags"):
        normalize_tags([*tags, bad], "app.task: tags")


@given(st.one_of(st.text(), st.binary(), st.integers(), st.none(), st.floats()))
def test_a_value_that_is_not_a_list_is_refused_not_split_into_letters(value):
    with pytest.raises(ValueError, match="must be a list of strings"):
        normalize_tags(value)


def test_more_than_max_tags_is_refused():
    with pytest.raises(ValueError, match=f"over {MAX_TAGS}"):
        normalize_tags([f"t{i}" for i in range(MAX_TAGS + 1)])
    assert len(normalize_tags(["same"] * (MAX_TAGS + 5))) == 1  # duplicates count once
