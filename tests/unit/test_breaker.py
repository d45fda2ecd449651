"""CircuitBreaker: sliding window, exponential capped backoff, half-open probe."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker


def make(**kw):
    args = dict(
        failure_ratio=0.5,
        min_calls=4,
        window_seconds=10.0,
        buckets=10,
        base_backoff_seconds=1.0,
        max_backoff_seconds=8.0,
    )
    args.update(kw)
    return CircuitBreaker(**args)


def test_stays_closed_below_min_calls_even_if_all_fail():
    b = make()
    for t in range(3):
        b.record_failure(float(t))
    assert b.state == CLOSED and b.allow(3.0)


def test_opens_when_the_failure_ratio_is_reached_over_the_window():
    b = make()
    b.record_success(0.0)
    b.record_success(0.1)
    b.record_failure(0.2)
    assert b.state == CLOSED
    b.record_failure(0.3)  # 2 of 4 = 0.5
    assert b.state == OPEN
    assert b.allow(0.4) is False
    assert b.retry_in(0.5) == pytest.approx(0.8)


def test_failures_that_slid_out_of_the_window_do_not_count():
    b = make()
    for t in (0.0, 0.5, 1.0):
        b.record_failure(t)
    b.record_failure(20.0)  # the first three are 20 s old: 1 call in the window
    assert b.state == CLOSED
    assert b.counts(20.0) == (0, 1)


def test_half_open_admits_one_probe_after_the_backoff_and_closes_on_success():
    b = make()
    for t in range(4):
        b.record_failure(float(t))
    assert b.state == OPEN
    assert b.allow(3.9) is False
    assert b.allow(4.0) is True  # the probe
    assert b.state == HALF_OPEN
    assert b.allow(4.1) is False  # one probe at a time
    b.record_success(4.2)
    assert b.state == CLOSED and b.retry_in(4.2) == 0.0
    assert b.counts(4.2) == (0, 0)  # a fresh window


def test_a_failed_probe_reopens_with_doubled_backoff_up_to_the_cap():
    b = make()
    now = 0.0
    for _ in range(4):
        b.record_failure(now)
    backoffs = [b.backoff_seconds]
    for _ in range(6):
        now += b.backoff_seconds
        assert b.allow(now)
        b.record_failure(now)
        assert b.state == OPEN
        backoffs.append(b.backoff_seconds)
    assert backoffs == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]


def test_a_lost_probe_is_replaced_after_the_backoff():
    b = make()
    for t in range(4):
        b.record_failure(float(t))
    assert b.allow(4.0)
    assert b.allow(4.5) is False
    assert b.retry_in(4.5) == pytest.approx(0.5)
    assert b.allow(5.0) is True


def test_late_outcomes_while_open_are_ignored():
    b = make()
    for t in range(4):
        b.record_failure(float(t))
    b.record_success(3.1)
    b.record_failure(3.2)
    assert b.state == OPEN and b.backoff_seconds == 1.0


def test_bad_settings_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="failure_ratio"):
        make(failure_ratio=0)
    with pytest.raises(ValueError, match="min_calls"):
        make(min_calls=0)
    with pytest.raises(ValueError, match="backoff"):
        make(base_backoff_seconds=5.0, max_backoff_seconds=1.0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0.0, max_value=3.0), st.booleans()), max_size=60))
def test_closed_breaker_opens_exactly_when_the_window_model_says_so(steps):
    b = make(min_calls=5, window_seconds=4.0, buckets=4)
    events = []
    now = 0.0
    for dt, failed in steps:
        now += dt
        assert b.allow(now)
        events.append((now, failed))
        (b.record_failure if failed else b.record_success)(now)
        # Model: bucket-granular window of the last 4 one-second buckets.
        current = int(now // 1.0)
        window = [f for t, f in events if int(t // 1.0) > current - 4]
        should_open = failed and len(window) >= 5 and sum(window) >= 0.5 * len(window)
        assert (b.state == OPEN) == should_open
        if should_open:
            break
