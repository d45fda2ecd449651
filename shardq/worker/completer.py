"""The completer: writes outcomes in fenced batches, off the executors' path.

Executors ``put`` an outcome and move on; this thread gathers whatever is
queued (up to ``batch`` outcomes, lingering ``flush_seconds`` for more) and
writes it with one ``complete_jobs`` statement. Outcomes the statement did
not return lost ownership (a takeover re-fenced them, or a later claim moved
them on): each is counted as a fence rejection and logged at WARNING, never
raised. When a write's COMMIT outcome is unknown (the connection died), the
same fenced batch is sent again; any row it no longer matches is checked with
``outcomes_applied`` so a write that did land is not miscounted.

It also remembers the SUCCESSFUL outcomes of jobs finished here until their
write is known to have landed (``recall``): a job whose outcome was rejected
because this worker's lease lapsed comes back READY, and when this worker
claims it again the fetcher writes the remembered result under the new
claim instead of running the task a second time. The memory is a
``FifoSet``: bounded, oldest forgotten first, in batches. Outcomes a task
committed in its own transaction never pass through here (their side effects
rolled back with the rejected write, so they must run again).
"""

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..core.fifoset import FifoSet
from ..db.store import JobRef, WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .jobs import Outcome
from .stats import Stats

if TYPE_CHECKING:
    from ..metrics import Metrics

logger = logging.getLogger("shardq.worker.completer")

# How many finished-but-unconfirmed outcomes are remembered for ``recall``:
# enough for every outcome a busy worker produces while its lease lapses and
# comes back (a few TTLs of no-op jobs); the oldest go first. Larger return
# values are not remembered: such a job runs again (at-least-once).
REMEMBERED_OUTCOMES = 8192
REMEMBERED_RESULT_BYTES = 16384

# The counter an applied outcome adds to, by status.
_COUNTER_OF = {"SUCCESSFUL": "succeeded", "FAILED": "failed", "READY": "retried"}


class ReturnedJob(JobRef, Protocol):
    """A claimed job handed back (a ``ClaimedJob``, or the fetcher's ``LostClaim``)."""

    @property
    def shard(self) -> int: ...


class Completer:
    def __init__(
        self, store: WorkerStore, stats: Stats, *, batch: int, flush_seconds: float, metrics: "Metrics | None" = None
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.stats = stats
        self.batch = batch
        self.flush_seconds = flush_seconds
        self._queue: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
        self._returns: list[ReturnedJob] = []
        self._returns_lock = threading.Lock()
        # Plain dicts, not Counters: a Counter's += on a new key calls its
        # Python-level __missing__, once per job here.
        self._pending_by_shard: dict[int, int] = {}
        # Counted: a recalled outcome can be queued while the rejected one
        # it replaces is still being written.
        self._pending_ids: dict[int, int] = {}
        self._finished_ids: FifoSet[int] = FifoSet(REMEMBERED_OUTCOMES)
        self._finished_outcomes: dict[int, Outcome] = {}
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        # Called after outcomes landed (the workflow resolver's wake-up: a
        # parent that just finished has its children moved on at once).
        self.on_written: Callable[[], None] | None = None

    # -- from executors ----------------------------------------------------------

    def put(self, outcome: Outcome) -> None:
        with self._pending_lock:
            self._pending_by_shard[outcome.shard] = self._pending_by_shard.get(outcome.shard, 0) + 1
            self._pending_ids[outcome.id] = self._pending_ids.get(outcome.id, 0) + 1
            if outcome.status == "SUCCESSFUL" and len(outcome.return_value_json or "") <= REMEMBERED_RESULT_BYTES:
                for forgotten in self._finished_ids.add(outcome.id):
                    del self._finished_outcomes[forgotten]
                self._finished_outcomes[outcome.id] = outcome
        self._queue.put(outcome)

    def recall(self, job_ids: Iterable[int]) -> dict[int, Outcome]:
        """The remembered SUCCESSFUL outcomes of these jobs: finished here, the
        write not (yet) known to have landed."""
        with self._pending_lock:
            remembered = self._finished_outcomes
            return {job_id: remembered[job_id] for job_id in job_ids if job_id in remembered}

    def return_jobs(self, jobs: Sequence[ReturnedJob]) -> None:
        """Claimed jobs that will not start here: back to READY (fenced).

        Counted as pending in their shards until written: a shard is released
        only after its returns, or the next owner would find the jobs still
        RUNNING under this claim and rescue them, counting an attempt that
        never ran (and dead-lettering a max_attempts=1 job unrun)."""
        if jobs:
            with self._pending_lock:
                for job in jobs:
                    self._pending_by_shard[job.shard] = self._pending_by_shard.get(job.shard, 0) + 1
            with self._returns_lock:
                self._returns.extend(jobs)
            self._queue.put(None)  # wake the thread

    def holds(self, job_id: int) -> bool:
        """Is an outcome of this job queued or being written?"""
        with self._pending_lock:
            return job_id in self._pending_ids

    def pending_in_shard(self, shard: int) -> int:
        with self._pending_lock:
            return self._pending_by_shard.get(shard, 0)

    @property
    def pending(self) -> int:
        with self._pending_lock:
            return sum(self._pending_by_shard.values())

    # -- the thread ----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shardq-completer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.flush_once(block=True)
        except BaseException as exc:
            self.failure = exc
            logger.exception("the completer died; the worker stops")
            raise

    def stop(self, deadline: float) -> None:
        """Write everything queued (until ``deadline``, monotonic), then stop."""
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=max(0.1, deadline - time.monotonic()))
        while (self.pending or self._returns) and time.monotonic() < deadline:
            self.flush_once(block=False, deadline=deadline)

    def flush_once(self, block: bool, deadline: float | None = None) -> None:
        outcomes: list[Outcome] = []
        try:
            first = self._queue.get(timeout=0.2) if block else self._queue.get_nowait()
        except queue.Empty:
            first = None
        if first is not None:
            outcomes.append(first)
        linger_until = time.monotonic() + self.flush_seconds
        while len(outcomes) < self.batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                if not outcomes or time.monotonic() >= linger_until or self._stop.is_set():
                    break
                time.sleep(self.flush_seconds / 5)
                continue
            if item is not None:
                outcomes.append(item)
        if outcomes:
            self._write(outcomes, deadline)
        with self._returns_lock:
            returns, self._returns = self._returns, []
        if returns:
            self._write_returns(returns, deadline)

    def _retrying[R](self, call: Callable[[], R], what: str, deadline: float | None) -> tuple[R, bool]:
        """Run ``call`` until it succeeds; returns (result, whether a try failed)."""
        delay, failed = 0.05, False
        while True:
            try:
                return call(), failed
            except DatabaseUnavailable as exc:
                failed = True
                self.stats.add("db_errors")
                logger.warning("%s failed, sending the same fenced write again: %s", what, exc)
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _write(self, outcomes: list[Outcome], deadline: float | None) -> None:
        try:
            applied, uncertain, refused = self._write_batch(outcomes, deadline)
            if refused:
                # The row domain: PostgreSQL refused these outcomes (a value
                # jsonb cannot hold, a value over a limit). The rest of the
                # batch is written; each of these jobs fails with an error
                # naming why, and its own outcome is dropped.
                replacements = [self._refused(outcome, error) for outcome, error in refused]
                more, more_uncertain, still = self._write_batch(replacements, deadline)
                for outcome, error in still:
                    logger.error(
                        "job %s: even its failure could not be written (%s); its shard's "
                        "next owner will find it in flight",
                        outcome.id,
                        error,
                    )
                applied |= more
                uncertain = uncertain or more_uncertain
                outcomes = [o for o in outcomes if all(o is not r for r, _ in refused)] + replacements
                self._settle(replacements)  # counted once: by the outcome they replace
            missing = [o for o in outcomes if (o.id, o.rank) not in applied]
            if missing and uncertain:
                landed, _ = self._retrying(lambda: self.store.outcomes_applied(missing), "ack check", deadline)
                applied |= landed
        except DatabaseUnavailable:
            logger.error(
                "shutdown deadline passed with %s outcomes unwritten; their shards' next owner will run them again",
                len(outcomes),
            )
            applied = set()
            self._settle(outcomes)
            return
        if applied:
            with self._pending_lock:
                # Landed: the job is final (or retrying), never claimed back.
                for job_id, _rank in applied:
                    if self._finished_outcomes.pop(job_id, None) is not None:
                        self._finished_ids.discard(job_id)
            if self.on_written is not None:
                self.on_written()
        if self.metrics is not None:
            self.metrics.outcomes_written(outcomes, applied)
        counts = dict.fromkeys(("succeeded", "failed", "retried", "fence_rejections"), 0)
        for outcome in outcomes:
            if (outcome.id, outcome.rank) in applied:
                counts[_COUNTER_OF[outcome.status]] += 1
            else:
                counts["fence_rejections"] += 1
                logger.warning(
                    "outcome of job %s rejected: this worker's fence %s is no longer current "
                    "(shard %s changed hands or the job moved on); not written",
                    outcome.id,
                    outcome.fence,
                    outcome.shard,
                )
        for name, n in counts.items():
            if n:
                self.stats.add(name, n)
        self._settle(outcomes)

    def _write_batch(
        self, outcomes: list[Outcome], deadline: float | None
    ) -> tuple[set[tuple[int, int]], bool, list[tuple[Outcome, StatementRejected]]]:
        """(applied pairs, whether a try failed, [(outcome, StatementRejected)])."""
        (applied, refused), uncertain = self._retrying(lambda: self.store.complete_jobs(outcomes), "ack", deadline)
        return applied, uncertain, refused

    def _refused(self, outcome: Outcome, error: Exception) -> Outcome:
        """The FAILED outcome that replaces one PostgreSQL refused to store."""
        self.stats.add("outcomes_refused")
        logger.error("job %s: PostgreSQL refused its outcome (%s); the job fails", outcome.id, error)
        with self._pending_lock:
            if self._finished_outcomes.pop(outcome.id, None) is not None:
                self._finished_ids.discard(outcome.id)
            self._pending_by_shard[outcome.shard] = self._pending_by_shard.get(outcome.shard, 0) + 1
            self._pending_ids[outcome.id] = self._pending_ids.get(outcome.id, 0) + 1
        reason = str(error).encode("ascii", "backslashreplace").decode("ascii").replace("\x00", "\\x00")[:2000]
        text = (
            f"shardq.exceptions.OutcomeRejected: PostgreSQL refused to store the {outcome.status} "
            f"outcome of job {outcome.id} (its return value or error text): {reason}\n"
        )
        return Outcome(
            outcome.id,
            outcome.fence,
            outcome.rank,
            "FAILED",
            error_json=Outcome.error("shardq.exceptions.OutcomeRejected", text),
            shard=outcome.shard,
            attempts=outcome.attempts,
            job=outcome.job,
        )

    def _settle(self, outcomes: Sequence[Outcome] | Sequence[ReturnedJob], *, returns: bool = False) -> None:
        with self._pending_lock:
            for outcome in outcomes:
                if not returns:  # returns are counted per shard only
                    ids_left = self._pending_ids[outcome.id] - 1
                    if ids_left:
                        self._pending_ids[outcome.id] = ids_left
                    else:
                        del self._pending_ids[outcome.id]
                left = self._pending_by_shard[outcome.shard] - 1
                if left:
                    self._pending_by_shard[outcome.shard] = left
                else:
                    del self._pending_by_shard[outcome.shard]

    def _write_returns(self, jobs: list[ReturnedJob], deadline: float | None) -> None:
        try:
            returned, _ = self._retrying(lambda: self.store.return_jobs(jobs), "return", deadline)
        except DatabaseUnavailable:
            return  # still RUNNING under the old fence: the next takeover rescues them
        finally:
            self._settle(jobs, returns=True)
        self.stats.add("returned", len(returned))
