"""A sliding-window circuit breaker with time passed in.

Used around calls that fail as a group (the database during a failover, a
task's downstream service): when most recent calls fail, stop calling for a
while instead of piling up timeouts, then probe.

State model::

    CLOSED --(failure ratio >= threshold over the window, >= min_calls)--> OPEN
    OPEN   --(backoff elapsed; allow() admits one probe)--------------> HALF_OPEN
    HALF_OPEN --(a success)--> CLOSED      (window cleared, backoff reset)
    HALF_OPEN --(a failure)--> OPEN        (backoff doubles, up to the cap)

* The window is ``window_seconds`` long, kept as ``buckets`` fixed-width
  buckets of (successes, failures): memory is constant however many calls
  are made, and old buckets fall out as time moves on.
* Backoff after the n-th consecutive opening is
  ``min(base_backoff_seconds * 2**(n-1), max_backoff_seconds)``.
* In HALF_OPEN one probe is in flight at a time; if its outcome is never
  reported (the caller died), another probe is admitted after the current
  backoff so the breaker cannot wedge open.
* Outcomes recorded while OPEN are late answers to calls admitted earlier:
  they are ignored.

``now`` is any monotonic clock in seconds supplied by the caller; the breaker
never reads a clock. Not thread-safe: the owner locks.
"""

from math import floor

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


class CircuitBreaker:
    """Closed → open → half-open → closed, over a sliding time window."""

    __slots__ = (
        "_backoff",
        "_bucket_ids",
        "_bucket_width",
        "_fail",
        "_nbuckets",
        "_ok",
        "_opened_at",
        "_openings",
        "_probe_at",
        "_state",
        "base_backoff_seconds",
        "failure_ratio",
        "max_backoff_seconds",
        "min_calls",
        "window_seconds",
    )

    def __init__(
        self,
        *,
        failure_ratio: float = 0.5,
        min_calls: int = 10,
        window_seconds: float = 30.0,
        buckets: int = 10,
        base_backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 60.0,
    ) -> None:
        if not 0.0 < failure_ratio <= 1.0:
            raise ValueError(f"failure_ratio must be in (0, 1], got {failure_ratio!r}")
        if min_calls < 1:
            raise ValueError(f"min_calls must be at least 1, got {min_calls!r}")
        if window_seconds <= 0 or buckets < 1:
            raise ValueError("window_seconds must be positive and buckets at least 1")
        if base_backoff_seconds <= 0 or max_backoff_seconds < base_backoff_seconds:
            raise ValueError("need 0 < base_backoff_seconds <= max_backoff_seconds")
        self.failure_ratio = failure_ratio
        self.min_calls = min_calls
        self.window_seconds = window_seconds
        self.base_backoff_seconds = base_backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._nbuckets = buckets
        self._bucket_width = window_seconds / buckets
        self._bucket_ids: list[int | None] = [None] * buckets  # absolute bucket number held in each slot
        self._ok = [0] * buckets
        self._fail = [0] * buckets
        self._state: str = CLOSED
        self._opened_at = 0.0
        self._backoff = 0.0
        self._openings = 0
        self._probe_at: float | None = None  # when the in-flight half-open probe was admitted

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` as of the last call."""
        return self._state

    @property
    def backoff_seconds(self) -> float:
        """The current (or last) open period's length."""
        return self._backoff

    def counts(self, now: float) -> tuple[int, int]:
        """``(successes, failures)`` inside the window ending at ``now``."""
        current = floor(now / self._bucket_width)
        oldest = current - self._nbuckets + 1
        ok = fail = 0
        for i, bucket_id in enumerate(self._bucket_ids):
            if bucket_id is not None and oldest <= bucket_id <= current:
                ok += self._ok[i]
                fail += self._fail[i]
        return ok, fail

    def allow(self, now: float) -> bool:
        """May a call be made now? In HALF_OPEN, True admits the probe."""
        state = self._state
        if state is CLOSED:
            return True
        if state is OPEN:
            if now < self._opened_at + self._backoff:
                return False
            self._state = HALF_OPEN
            self._probe_at = now
            return True
        # HALF_OPEN: one probe at a time, re-admitted if its outcome never came.
        if self._probe_at is None or now >= self._probe_at + self._backoff:
            self._probe_at = now
            return True
        return False

    def retry_in(self, now: float) -> float:
        """Seconds until ``allow`` may say yes (0.0 when it may now)."""
        if self._state is CLOSED:
            return 0.0
        if self._state is OPEN:
            return max(0.0, self._opened_at + self._backoff - now)
        if self._probe_at is None:
            return 0.0
        return max(0.0, self._probe_at + self._backoff - now)

    def record_success(self, now: float) -> None:
        state = self._state
        if state is CLOSED:
            self._bucket(now)
            self._ok[self._slot(now)] += 1
        elif state is HALF_OPEN:
            self._close()

    def record_failure(self, now: float) -> None:
        state = self._state
        if state is CLOSED:
            self._bucket(now)
            self._fail[self._slot(now)] += 1
            ok, fail = self.counts(now)
            calls = ok + fail
            if calls >= self.min_calls and fail >= self.failure_ratio * calls:
                self._open(now)
        elif state is HALF_OPEN:
            self._open(now)

    def reset(self) -> None:
        """Back to CLOSED with an empty window and no backoff history."""
        self._close()

    # -- internals -----------------------------------------------------------
    def _slot(self, now: float) -> int:
        return floor(now / self._bucket_width) % self._nbuckets

    def _bucket(self, now: float) -> None:
        bucket_id = floor(now / self._bucket_width)
        slot = bucket_id % self._nbuckets
        if self._bucket_ids[slot] != bucket_id:
            # The slot holds an expired bucket: reuse it.
            self._bucket_ids[slot] = bucket_id
            self._ok[slot] = 0
            self._fail[slot] = 0

    def _open(self, now: float) -> None:
        self._openings += 1
        self._backoff = min(
            self.base_backoff_seconds * 2.0 ** min(self._openings - 1, 60),
            self.max_backoff_seconds,
        )
        self._opened_at = now
        self._state = OPEN
        self._probe_at = None

    def _close(self) -> None:
        self._state = CLOSED
        self._openings = 0
        self._backoff = 0.0
        self._probe_at = None
        n = self._nbuckets
        self._bucket_ids = [None] * n
        self._ok = [0] * n
        self._fail = [0] * n
