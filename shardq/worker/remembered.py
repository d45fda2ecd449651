"""Remembered outcomes: SUCCESSFUL results of jobs finished here whose write
is not yet known to have landed.

A job whose outcome was rejected because this worker's lease lapsed comes
back READY; when this worker claims it again, the fetcher writes the
remembered result under the new claim (``recall``) instead of running the
task a second time. The memory is a ``FifoSet``: bounded, oldest forgotten
first, in batches. Outcomes a task committed in its own transaction are
never remembered (their side effects rolled back with the rejected write, so
they must run again), nor are return values over REMEMBERED_RESULT_BYTES
(such a job runs again: at-least-once).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..core.fifoset import FifoSet
from .jobs import Outcome

# Enough for every outcome a busy worker produces while its lease lapses and
# comes back (a few TTLs of no-op jobs); the oldest go first.
REMEMBERED_OUTCOMES = 8192
REMEMBERED_RESULT_BYTES = 16384


class RememberedOutcomes:
    def __init__(self, capacity: int = REMEMBERED_OUTCOMES) -> None:
        self._lock = threading.Lock()
        self._ids: FifoSet[int] = FifoSet(capacity)
        self._outcomes: dict[int, Outcome] = {}

    def remember(self, outcome: Outcome) -> None:
        """Keep a SUCCESSFUL outcome small enough to write again later."""
        if outcome.status != "SUCCESSFUL":
            return
        value = outcome.return_value_json
        if value is not None and len(value) > REMEMBERED_RESULT_BYTES:
            return
        with self._lock:
            evicted = self._ids.add(outcome.id)
            if evicted:
                for forgotten in evicted:
                    del self._outcomes[forgotten]
            self._outcomes[outcome.id] = outcome

    def recall(self, job_ids: Iterable[int]) -> dict[int, Outcome]:
        """The remembered outcomes of these jobs (finished here, the write not known to have landed)."""
        with self._lock:
            remembered = self._outcomes
            return {job_id: remembered[job_id] for job_id in job_ids if job_id in remembered}

    def forget(self, job_ids: Iterable[int]) -> None:
        """These jobs' outcomes landed (or were replaced): they are never claimed back."""
        outcomes, discard = self._outcomes, self._ids.discard
        with self._lock:
            for job_id in job_ids:
                if outcomes.pop(job_id, None) is not None:
                    discard(job_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._outcomes)
