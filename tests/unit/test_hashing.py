"""Hash functions: published vectors, ranges, stability and the hashtag rule."""

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core.hashing import (
    crc16_xmodem,
    fnv1a_32,
    hashtag,
    key_slot,
    lane_count,
    lane_index,
    murmur3_32,
    shard_for,
    shard_key_hash,
)

keys = st.text(max_size=40)


def test_fnv1a_of_empty_input_is_the_offset_basis():
    assert fnv1a_32("") == 0x811C9DC5
    assert fnv1a_32(b"") == 0x811C9DC5


def test_fnv1a_matches_published_vectors():
    assert fnv1a_32("a") == 0xE40C292C
    assert fnv1a_32("foobar") == 0xBF9CF968


def test_crc16_matches_the_xmodem_check_value():
    assert crc16_xmodem(b"123456789") == 0x31C3


def test_key_slot_matches_redis_cluster_for_the_published_key():
    assert key_slot("123456789") == 12739
    assert key_slot(b"123456789") == 12739


def test_key_slot_hashes_only_a_non_empty_hashtag():
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("{user1000}.following") == key_slot("user1000")
    # Empty tag: the whole key is hashed.
    assert key_slot("foo{}{bar}") == crc16_xmodem("foo{}{bar}") % 16384
    # Only the first `{` counts, up to the next `}`.
    assert key_slot("foo{{bar}}zap") == crc16_xmodem("{bar") % 16384
    assert key_slot("foo{bar}{zap}") == key_slot("bar")


def test_hashtag_follows_the_redis_rule():
    assert hashtag("order:{42}:line:7") == "42"
    assert hashtag("plain") == "plain"
    assert hashtag("a{}b") == "a{}b"
    assert hashtag("a{b") == "a{b"
    assert hashtag("x}{y}") == "y"


def test_keys_sharing_a_hashtag_land_on_one_shard():
    a = shard_key_hash("order:{42}:line:7")
    b = shard_key_hash("invoice:{42}")
    assert a == b == mmh3.hash("42", 0, signed=True)
    assert shard_for(a, 64) == shard_for(b, 64)


def test_lane_count_is_the_next_power_of_two_capped_at_64():
    expected = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 16: 16, 17: 32, 32: 32, 33: 64, 64: 64, 65: 64, 1000: 64}
    assert {n: lane_count(n) for n in expected} == expected


def test_lane_count_refuses_zero_cores():
    with pytest.raises(ValueError, match="cpu_cores"):
        lane_count(0)


@settings(max_examples=200)
@given(st.one_of(keys, st.binary(max_size=40)))
def test_fnv1a_is_an_unsigned_32_bit_value_and_stable(data):
    h = fnv1a_32(data)
    assert 0 <= h < 2**32
    assert fnv1a_32(data) == h
    if isinstance(data, str):
        assert fnv1a_32(data.encode()) == h


@settings(max_examples=200)
@given(keys)
def test_shard_key_hash_is_a_signed_32_bit_murmur3_of_the_hashtag(key):
    h = shard_key_hash(key)
    assert -(2**31) <= h < 2**31
    assert h == murmur3_32(hashtag(key))


@settings(max_examples=200)
@given(keys, st.sampled_from([1, 2, 4, 64, 128, 1024]))
def test_shard_is_in_range_and_a_power_of_two_reshard_keeps_or_adds_half(key, count):
    h = shard_key_hash(key)
    shard = shard_for(h, count)
    assert 0 <= shard < count
    # Doubling the shard count moves a key to its old shard or old + count.
    assert shard_for(h, count * 2) in (shard, shard + count)


@settings(max_examples=200)
@given(keys, st.text(min_size=1, max_size=10), keys)
def test_key_slot_is_in_range_and_depends_only_on_the_tag(prefix, tag, suffix):
    tagged = f"{prefix.replace('{', '')}{{{tag.replace('}', '')}}}{suffix}"
    slot = key_slot(tagged)
    assert 0 <= slot < 16384
    inner = tag.replace("}", "")
    if inner:  # the first `{` is ours and the next `}` closes it
        assert slot == crc16_xmodem(inner) % 16384


@settings(max_examples=100)
@given(st.integers(min_value=-(2**31), max_value=2**32), st.sampled_from([1, 2, 8, 64]))
def test_lane_index_masks_into_range(h, count):
    assert 0 <= lane_index(h, count) < count
    assert lane_index(h, count) == h % count
