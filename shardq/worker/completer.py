"""The completer: writes outcomes in fenced batches, off the executors' path.

Executors ``put`` an outcome and move on; this thread gathers whatever is
queued (up to ``batch`` outcomes, lingering ``flush_seconds`` for more) and
writes it with one ``complete_jobs`` statement. Outcomes the statement did
not return lost ownership (a takeover re-fenced them, or a later claim moved
them on): each is counted as a fence rejection and logged at WARNING, never
raised. When a write's COMMIT outcome is unknown (the connection died), the
same fenced batch is sent again; any row it no longer matches is checked with
``outcomes_applied`` so a write that did land is not miscounted.

It writes outcomes only. The SUCCESSFUL outcomes it is given are kept in
``RememberedOutcomes`` (worker/remembered.py) until their write lands, and
claimed jobs that will not run here go back through ``HandBack``
(worker/handback.py), each the owner of its own state.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .handback import retrying
from .jobs import Outcome
from .pipeline import Pipeline, PipelineConfig
from .service import Service

logger = logging.getLogger("shardq.worker.completer")

# The counter an applied outcome adds to, by status.
_COUNTER_OF = {"SUCCESSFUL": "succeeded", "FAILED": "failed", "READY": "retried"}


class Completer(Service):
    name = "completer"

    def __init__(self, config: PipelineConfig, pipeline: Pipeline, store: WorkerStore) -> None:
        super().__init__()
        self.store = store
        self.pipeline = pipeline
        # SUCCESSFUL outcomes not yet known to have landed, for a recall.
        self.remembered = pipeline.remembered
        self.metrics = pipeline.metrics
        self.stats = pipeline.stats
        self.signals = pipeline.signals
        self.batch = config.settings.completion_batch
        self.flush_seconds = config.settings.completion_flush_seconds
        self._queue: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
        # Plain dicts, not Counters: a Counter's += on a new key calls its
        # Python-level __missing__, once per job here.
        self._pending_by_shard: dict[int, int] = {}
        # Counted: a recalled outcome can be queued while the rejected one
        # it replaces is still being written.
        self._pending_ids: dict[int, int] = {}
        self._pending_lock = threading.Lock()

    # -- from executors ----------------------------------------------------------

    def put(self, outcome: Outcome) -> None:
        shard, job_id = outcome.shard, outcome.id
        by_shard, ids = self._pending_by_shard, self._pending_ids
        with self._pending_lock:
            by_shard[shard] = by_shard.get(shard, 0) + 1
            ids[job_id] = ids.get(job_id, 0) + 1
        self.remembered.remember(outcome)
        self._queue.put(outcome)
        self.signals.finished.signal(outcome)

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

    def run(self) -> None:
        while not self.stopping:
            self.flush_once(block=True)

    def interrupt(self) -> None:
        self._queue.put(None)

    def after_stop(self, deadline: float) -> None:
        """Write everything still queued, until ``deadline`` (monotonic)."""
        while self.pending and time.monotonic() < deadline:
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
                # No lingering for an outcome whose limit slot or key gate
                # waits for its write (Outcome.after_written): the next job
                # of its limit starts only then.
                if (
                    not outcomes
                    or time.monotonic() >= linger_until
                    or self.stopping
                    or any(o.after_written is not None for o in outcomes)
                ):
                    break
                time.sleep(self.flush_seconds / 5)
                continue
            if item is not None:
                outcomes.append(item)
        if outcomes:
            self._write(outcomes, deadline)

    def _retrying[R](self, call: Callable[[], R], what: str, deadline: float | None) -> tuple[R, bool]:
        return retrying(call, what, deadline, self.stats, logger)

    def _write(self, outcomes: list[Outcome], deadline: float | None) -> None:
        parents: set[int] = set()  # written jobs whose children wait for the resolver
        try:
            applied, uncertain, refused = self._write_batch(outcomes, deadline, parents)
            if refused:
                # The row domain: PostgreSQL refused these outcomes (a value
                # jsonb cannot hold, a value over a limit). The rest of the
                # batch is written; each of these jobs fails with an error
                # naming why, and its own outcome is dropped.
                replacements = [self._refused(outcome, error) for outcome, error in refused]
                more, more_uncertain, still = self._write_batch(replacements, deadline, parents)
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
            _let_go(outcomes)
            return
        if applied:
            # Landed: the job is final (or retrying), never claimed back.
            self.remembered.forget(job_id for job_id, _rank in applied)
            # The resolver is woken for a parent whose children wait (a
            # statement of its own per ack batch was a share of a no-op
            # drain's CPU, here and in PostgreSQL), or when a lost answer
            # hid which of them are parents.
            if parents or uncertain:
                self.pipeline.outcomes_written()
        if self.metrics is not None:
            self.metrics.outcomes_written(outcomes, applied)
        counts = dict.fromkeys(("succeeded", "failed", "retried", "fence_rejections"), 0)
        if len(applied) == len(outcomes):
            # Every outcome landed (the pairs written are a subset of those
            # sent, so as many means all): no lookup per outcome.
            statuses = [outcome.status for outcome in outcomes]
            for status, name in _COUNTER_OF.items():
                counts[name] = statuses.count(status)
            outcomes_rejected: list[Outcome] = []
        else:
            outcomes_rejected = outcomes
        rejected = [o for o in outcomes_rejected if (o.id, o.rank) not in applied]
        cancelled = self._cancelled(rejected)
        for outcome in outcomes_rejected:
            if (outcome.id, outcome.rank) in applied:
                counts[_COUNTER_OF[outcome.status]] += 1
            elif outcome.id in cancelled:
                # shardq.cancel() ended the job while it ran: refusing its
                # outcome is the cancel working, not a lost lease.
                counts["fence_rejections"] += 1
                logger.info("job %s was cancelled while it ran: the cancelled job's outcome was dropped", outcome.id)
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
        _let_go(outcomes)
        self.signals.written.signal(applied)

    def _cancelled(self, rejected: list[Outcome]) -> set[int]:
        """The ids among these refused outcomes whose job was cancelled
        (one query, only when an outcome was refused); unknown (the
        database unreachable) reads as none."""
        if not rejected:
            return set()
        try:
            return self.store.cancelled_attempts([(o.id, o.rank) for o in rejected])
        except (DatabaseUnavailable, StatementRejected):
            return set()

    def _write_batch(
        self, outcomes: list[Outcome], deadline: float | None, parents: set[int] | None = None
    ) -> tuple[set[tuple[int, int]], bool, list[tuple[Outcome, StatementRejected]]]:
        """(applied pairs, whether a try failed, [(outcome, StatementRejected)]);
        written workflow parents with children pending are added to ``parents``."""
        (applied, refused), uncertain = self._retrying(
            lambda: self.store.complete_jobs(outcomes, parents), "ack", deadline
        )
        self.stats.add("ack_writes")
        return applied, uncertain, refused

    def _refused(self, outcome: Outcome, error: Exception) -> Outcome:
        """The FAILED outcome that replaces one PostgreSQL refused to store."""
        self.stats.add("outcomes_refused")
        logger.error("job %s: PostgreSQL refused its outcome (%s); the job fails", outcome.id, error)
        self.remembered.forget([outcome.id])
        with self._pending_lock:
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
            after_written=outcome.after_written,
        )

    def _settle(self, outcomes: Sequence[Outcome]) -> None:
        ids, by_shard = self._pending_ids, self._pending_by_shard
        with self._pending_lock:
            for outcome in outcomes:
                job_id, shard = outcome.id, outcome.shard
                ids_left = ids[job_id] - 1
                if ids_left:
                    ids[job_id] = ids_left
                else:
                    del ids[job_id]
                left = by_shard[shard] - 1
                if left:
                    by_shard[shard] = left
                else:
                    del by_shard[shard]


def _let_go(outcomes: Sequence[Outcome]) -> None:
    """What each job held until its outcome was in the table goes now."""
    for outcome in outcomes:
        if outcome.after_written is not None:
            outcome.after_written()
