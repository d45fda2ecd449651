"""The pure part of limits (shardq/core/limits.py): rates, GCRA, the pick."""

from hypothesis import given
from hypothesis import strategies as st

from shardq.core.limits import assign, grant, next_token_in, parse_rate


def test_rates_parse_with_a_burst_of_a_tenth_of_a_second():
    assert (parse_rate("20/s").per_second, parse_rate("20/s").burst) == (20.0, 2)
    assert parse_rate("1000/m").per_second == 1000 / 60 and parse_rate("1000/m").burst == 2
    assert parse_rate("5/h").burst == 1 and parse_rate("100/second").burst == 10


@given(
    st.sampled_from(["20/s", "3/s", "1000/m", "500/s"]),
    st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 50)), min_size=1, max_size=60),
)
def test_gcra_never_grants_more_than_rate_times_window_plus_burst(text, steps):
    rate = parse_rate(text)
    now, tat, grants = 1000.0, 0.0, []
    for gap, wanted in steps:
        now += gap
        n, tat = grant(tat, now, rate, wanted)
        assert 0 <= n <= wanted
        grants += [now] * n
    for start in grants:
        in_window = sum(1 for t in grants if start <= t < start + 1.0)
        assert in_window <= rate.per_second * 1.0 + rate.burst + 1e-9


def test_gcra_grants_the_burst_then_one_per_interval_and_says_when():
    rate = parse_rate("20/s")
    n, tat = grant(0.0, 100.0, rate, 10)
    assert n == 2  # the burst
    assert grant(tat, 100.0, rate, 10)[0] == 0
    wait = next_token_in(tat, 100.0, rate)
    assert abs(wait - 0.05) < 1e-9
    assert grant(tat, 100.0 + wait, rate, 10)[0] == 1


def test_assign_takes_a_job_only_when_all_its_limits_have_room_and_keeps_order():
    jobs = [(1, ["a"]), (2, ["a", "q"]), (3, ["b"]), (4, ["q"]), (5, [])]
    taken, used = assign(jobs, {"a": 1, "q": 1, "b": 0})
    # 2 is held back by "a" (1 took it) and leaves "q" to 4; 3 waits for "b"; 5 is unlimited.
    assert taken == [1, 4, 5] and used == {"a": 1, "q": 1}
