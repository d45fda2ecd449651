"""Concurrency and rate limits: the pure part (no Django, no I/O, no clock).

A limit is named by a *limit key*: ``t:<task path>`` (a task's own limit),
``t:<task path>=<value>`` (one partition of a task limited ``limit_by`` an
argument) or ``q:<queue>`` (a queue's limit). A job carries the keys of the
limits that apply to it (``shardq_job.limit_keys``); a worker looks their
capacity up in its own configuration (``LimitSpec``) when it claims.

Rate limits are GCRA (the generic cell rate algorithm, a token bucket kept
as one timestamp): ``tat`` is the theoretical arrival time of the next
token. With ``interval = 1 / rate`` and a burst of ``b`` tokens, a grant at
``now`` is allowed while ``tat - now <= (b - 1) * interval``; each grant
moves ``tat`` on by ``interval``. So in any window of ``w`` seconds at most
``rate * w + b`` grants are made, and over a long run the count tends to
``rate * w``.
"""

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# "100/s", "1000/m", "5/h", also "100/second", "3/minute", "2/hour".
RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
# The default burst: this many seconds of the rate, at least one token.
BURST_SECONDS = 0.1
MAX_CONCURRENCY = 100_000
# Of an interval: rounding of epoch-second times must not cost a token.
EPSILON = 1e-4
# Partition values longer than this (characters) are shortened by the caller
# (a digest): limit keys are primary-key text.
MAX_KEY_CHARS = 200


class LimitError(ValueError):
    """A limit option that cannot be used (the message says what to write)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` per ``period`` seconds, with a burst of ``burst`` tokens."""

    count: int
    period: float
    burst: int

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @property
    def interval(self) -> float:
        """Seconds between two tokens."""
        return self.period / self.count

    @property
    def tolerance(self) -> float:
        """How far ahead of now ``tat`` may run: (burst - 1) intervals."""
        return (self.burst - 1) * self.interval


def parse_rate(text: object, what: str = "rate_limit") -> Rate:
    """``"100/s"`` or ``"1000/m"`` as a Rate (raises LimitError naming ``what``)."""
    if not isinstance(text, str):
        raise LimitError(
            f"{what} must be a string like '100/s' or '1000/m' (count per second, minute or hour), not {text!r}."
        )
    match = RATE.match(text)
    if match is None or int(match.group(1)) == 0:
        raise LimitError(
            f"{what}={text!r} is not a rate: write a positive whole count per unit, '100/s', '1000/m' or '5/h'."
        )
    count, period = int(match.group(1)), PERIODS[match.group(2)]
    if count / period > 1_000_000:
        raise LimitError(f"{what}={text!r} is over a million a second: leave the rate limit out instead.")
    burst = max(1, math.ceil(count / period * BURST_SECONDS))
    return Rate(count=count, period=period, burst=burst)


def check_concurrency(value: object, what: str = "max_concurrency") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CONCURRENCY:
        raise LimitError(
            f"{what} must be a whole number of jobs from 1 to {MAX_CONCURRENCY} that may run at once "
            f"across all workers, not {value!r}; leave it out for no limit."
        )
    return value


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """What one limit allows: jobs at once (None: any) and a rate (None: any)."""

    max_concurrency: int | None = None
    rate: Rate | None = None


def grant(tat: float, now: float, rate: Rate, wanted: int) -> tuple[int, float]:
    """GCRA: how many of ``wanted`` tokens may be taken at ``now`` (seconds),
    and the new ``tat``. ``tat`` in the past counts as ``now`` (an idle
    limit does not save up more than its burst)."""
    # Differences first: times are epoch seconds (~1.8e9), where a double
    # resolves only ~2e-7 s, so now + tolerance - tat would lose a token.
    ahead = max(0.0, tat - now)
    room = rate.tolerance - ahead
    if room < -EPSILON * rate.interval or wanted <= 0:
        return 0, tat
    granted = min(wanted, math.floor(room / rate.interval + EPSILON) + 1)
    return granted, now + ahead + granted * rate.interval


def next_token_in(tat: float, now: float, rate: Rate) -> float:
    """Seconds until one more token can be granted (0: now)."""
    return max(0.0, tat - rate.tolerance - now)


def assign(
    jobs: Sequence[tuple[int, Sequence[str]]],
    room: Mapping[str, int],
    limit: int | None = None,
) -> tuple[list[int], dict[str, int]]:
    """Pick jobs in the given (claim) order that every one of their limits
    has room for, at most ``limit``: a job is taken only when all its keys
    have room, which it then uses up one unit of each. Keys missing from
    ``room`` are unlimited. Returns the ids taken and how much each key used."""
    left = dict(room)
    used: dict[str, int] = {}
    taken: list[int] = []
    for job_id, keys in jobs:
        if limit is not None and len(taken) >= limit:
            break
        if all(left.get(k, 1) > 0 for k in keys):
            for k in keys:
                if k in left:
                    left[k] -= 1
                    used[k] = used.get(k, 0) + 1
            taken.append(job_id)
    return taken, used


def full_keys(room: Mapping[str, int]) -> set[str]:
    return {k for k, n in room.items() if n <= 0}


def sorted_keys(keys: Iterable[str]) -> list[str]:
    """Limit rows are locked in this order by every claimer (no deadlock)."""
    return sorted(set(keys))
