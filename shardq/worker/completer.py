"""The completer: writes outcomes in fenced batches, off the executors' path.

Executors ``put`` an outcome and move on; this thread gathers whatever is
queued (up to ``batch`` outcomes, lingering ``flush_seconds`` for more) and
writes it with one ``complete_jobs`` statement. Outcomes the statement did
not return lost ownership (a takeover re-fenced them, or a later claim moved
them on): each is counted as a fence rejection and logged at WARNING, never
raised. When a write's COMMIT outcome is unknown (the connection died), the
same fenced batch is sent again; any row it no longer matches is checked with
``outcomes_applied`` so a write that did land is not miscounted.

Outcomes ride on start writes: the executor thread that writes the next
group's starts takes what is queued here (``take_ride``) and sends it in the
same statement (``complete_and_start_jobs``), so while threads begin jobs
the acks cost no statement and no wake of this thread; this thread lingers
``flush_seconds`` before it writes what no start write took (at once for an
outcome whose limit slot or key gate waits for its write).

It writes outcomes only. The SUCCESSFUL outcomes it is given are kept in
``RememberedOutcomes`` (worker/remembered.py) until their write lands, and
claimed jobs that will not run here go back through ``HandBack``
(worker/handback.py), each the owner of its own state.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ..db.store import WorkerStore
from ..exceptions import DatabaseUnavailable, StatementRejected
from .handback import retrying
from .jobs import Outcome
from .pipeline import Pipeline, PipelineConfig
from .service import Service

logger = logging.getLogger("shardq.worker.completer")

#: How long the completer keeps trying to put back jobs whose start write
#: was lost while the database is away (Completer._lost_starts).
_LOST_STARTS_SECONDS = 30.0

# Outcomes that rode on start writes are flushed (made durable, then counted
# as landed) when the oldest has waited this long, or at once for a workflow
# parent whose children wait, or when this thread stops: about one
# synchronous commit each ACK_FLUSH_SECONDS while start writes carry acks.
# PostgreSQL's own WAL writer flushes them within 3 x wal_writer_delay.
ACK_FLUSH_SECONDS = 0.05
# While start writes carry the acks this thread looks at what is left this
# often (each look is a wake: a fifth of a no-op job's completer CPU at
# COMPLETION_FLUSH_SECONDS); an outcome no start write took waits at most
# this long after the last one that did.
RIDE_LOOK_SECONDS = ACK_FLUSH_SECONDS / 2

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
        # Queued outcomes: appended by put, taken from the left by this
        # thread or by a start write (take_ride); a deque's append and
        # popleft are atomic.
        self._queue: deque[Outcome] = deque()
        # Outcomes this thread writes at once, never carried: those whose
        # limit slot or key gate waits for the write, and those a start
        # write took and could not write.
        self._urgent_queue: deque[Outcome] = deque()
        # Outcomes start writes wrote, committed asynchronously as the
        # starts are: (outcomes, pairs written, workflow parents). They
        # have landed once a synchronous commit of this thread's flushed
        # the WAL past them (_flush_rides), and only then count as written.
        self._unflushed: deque[tuple[float, list[Outcome], set[tuple[int, int]], set[int]]] = deque()
        self._flush_now = False
        # Set by put while this thread waits for a first outcome, and for
        # an outcome whose limit slot or key gate waits for its write
        # (``_urgent``): no linger then.
        self._wake = threading.Event()
        self._idle = False
        self._urgent = False
        # Start writes that took outcomes (take_ride), and the count this
        # thread saw last: while they go on it lingers rather than writes.
        self._rides = 0
        self._rides_seen = 0
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
        if outcome.after_written is not None:
            self._urgent_queue.append(outcome)
            self._urgent = True
            self._wake.set()
        else:
            self._queue.append(outcome)
        if self._idle:
            self._wake.set()
        self.signals.finished.signal(outcome)

    # -- from a start write (the acks ride on it) ----------------------------------

    def take_ride(self, starting: Sequence[object]) -> list[Outcome]:
        """The queued outcomes (at most a batch) for a start write to carry,
        none of a job in ``starting`` (the jobs it starts: one statement
        must not update a row twice). Each is this caller's until it calls
        ``rode`` or ``ride_back``; until then it stays pending (``holds``)."""
        taken: list[Outcome] = []
        popleft = self._queue.popleft
        for _ in range(min(self.batch, len(self._queue))):
            try:
                taken.append(popleft())
            except IndexError:
                break
        if taken:
            self._rides += 1  # one start write at a time (StartWrites)
        if taken and starting:
            ids = {getattr(job, "id", None) for job in starting}
            clash = [o for o in taken if o.id in ids]
            if clash:
                self.ride_back(clash)
                taken = [o for o in taken if o.id not in ids]
        return taken

    def ride_back(self, outcomes: Sequence[Outcome], uncertain: bool = False) -> None:
        """Outcomes a start write took and did not land (its statement was
        refused, or its answer lost: ``uncertain``, the write may have
        landed): queued again, first, for this thread to write."""
        for outcome in outcomes:
            if uncertain:
                outcome.extra["ack_uncertain"] = True
            self._urgent_queue.append(outcome)
        self._urgent = True
        self._wake.set()

    def rode(self, outcomes: list[Outcome], applied: set[tuple[int, int]], parents: set[int]) -> None:
        """A start write carried ``outcomes``: settle those ``applied`` (the
        pairs it wrote; ``parents``: workflow parents among them with
        children pending). One it did not write goes back to this thread,
        which writes it again and tells a lost fence from a cancel (its own
        statements, on its own connection)."""
        landed = [o for o in outcomes if (o.id, o.rank) in applied]
        if len(landed) != len(outcomes):
            self.ride_back([o for o in outcomes if (o.id, o.rank) not in applied])
        if landed:
            # Written, committed asynchronously: landed once flushed.
            self._unflushed.append((time.monotonic(), landed, applied, parents))
            if parents:
                # Their children wait for the resolver, woken once landed.
                self._flush_now = True
                self._wake.set()

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
        self._wake.set()

    def after_stop(self, deadline: float) -> None:
        """Write everything still queued, until ``deadline`` (monotonic)."""
        while self.pending and time.monotonic() < deadline:
            if not self._queue and not self._urgent_queue and not self._unflushed:
                # Pending on a start write that carries them: its answer.
                time.sleep(0.001)
                continue
            self.flush_once(block=False, deadline=deadline)

    def flush_once(self, block: bool, deadline: float | None = None) -> None:
        """Write what is queued (at most a batch) and make what start
        writes carried durable. ``block``: wait for work first, and linger
        while start writes carry the queued outcomes (each takes all there
        is): write only what none took within ``flush_seconds``, or at
        once an urgent one (its limit slot or key gate waits for the
        write)."""
        queued, urgent = self._queue, self._urgent_queue
        if block:
            if not queued and not urgent:
                if self._rides == self._rides_seen and not self._unflushed:
                    # Nothing queued, no start write carrying any: sleep
                    # until put wakes this thread.
                    self._idle = True
                    if not queued and not urgent:
                        self._wake.wait(0.2)
                    self._idle = False
                else:
                    # Start writes carry the outcomes: look again later,
                    # with no wake from put meanwhile.
                    self._wake.wait(RIDE_LOOK_SECONDS)
                self._wake.clear()
                self._rides_seen = self._rides
            linger = self.flush_seconds
            while queued and not urgent and not self.stopping:
                seen = self._rides
                self._wake.wait(linger)
                linger = RIDE_LOOK_SECONDS
                self._wake.clear()
                if self._rides == seen:
                    break  # no start write took any within the linger: write them
            self._rides_seen = self._rides
        unflushed = self._unflushed
        if unflushed and (
            not block or self.stopping or self._flush_now or time.monotonic() - unflushed[0][0] >= ACK_FLUSH_SECONDS
        ):
            self._flush_now = False
            self._flush_rides(deadline)
        self._urgent = False
        outcomes: list[Outcome] = []
        for source in (urgent, queued):
            popleft = source.popleft
            for _ in range(min(self.batch - len(outcomes), len(source))):
                try:
                    outcomes.append(popleft())
                except IndexError:
                    break
        if outcomes:
            self._write(outcomes, deadline)

    def _flush_rides(self, deadline: float | None) -> None:
        """One synchronous commit on this thread's connection: once it
        returns, the WAL is flushed past every start write before it and
        the outcomes they carried have landed (counted, forgotten, what
        each job held let go). When a try failed (the server may have
        restarted and lost them), they are written again here, fenced, and
        checked (``ack_uncertain``)."""
        rides = []
        while self._unflushed:
            rides.append(self._unflushed.popleft())
        try:
            _, failed = self._retrying(self.store.flush_commits, "ack flush", deadline)
        except DatabaseUnavailable:
            failed = True
        self.stats.add("ack_flushes")
        for _, outcomes, applied, parents in rides:
            if failed:
                self.ride_back(outcomes, uncertain=True)
                continue
            self.stats.add("acks_carried", len(outcomes))
            self._landed(outcomes, applied, parents, uncertain=False)

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
            if missing and not uncertain:
                # A start write that carried one lost its answer: it may have landed.
                uncertain = any(o.extra.get("ack_uncertain") for o in missing)
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
        self._landed(outcomes, applied, parents, uncertain)

    def _landed(
        self, outcomes: list[Outcome], applied: set[tuple[int, int]], parents: set[int], uncertain: bool
    ) -> None:
        """What follows a write of ``outcomes`` (by this thread or a start
        write): counters, the remembered results, the resolver's wake, what
        each job held, the test signal."""
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
        lost_starts = self._lost_starts([o for o in rejected if o.id not in cancelled])
        for outcome in outcomes_rejected:
            if (outcome.id, outcome.rank) in applied:
                counts[_COUNTER_OF[outcome.status]] += 1
            elif outcome.id in cancelled:
                # shardq.cancel() ended the job while it ran: refusing its
                # outcome is the cancel working, not a lost lease.
                counts["fence_rejections"] += 1
                logger.info("job %s was cancelled while it ran: the cancelled job's outcome was dropped", outcome.id)
            elif outcome.id in lost_starts:
                counts["fence_rejections"] += 1
                logger.warning(
                    "job %s: its start write was lost (an asynchronous commit the server lost, as in a "
                    "failover), so its %s outcome was not written; the job is READY again and runs once more",
                    outcome.id,
                    outcome.status,
                )
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

    def _lost_starts(self, rejected: list[Outcome]) -> set[int]:
        """The ids among these refused outcomes whose start write was lost,
        put back READY (``return_lost_starts``; one statement, only when an
        outcome was refused). Written again while the database is away: a
        job left CLAIMED under this worker's own fence would wait for the
        shard to change hands."""
        if not rejected:
            return set()
        try:
            ids, _ = self._retrying(
                lambda: self.store.return_lost_starts(rejected), "lost starts", time.monotonic() + _LOST_STARTS_SECONDS
            )
        except DatabaseUnavailable:
            logger.error(
                "jobs %s: could not tell whether their start writes were lost (the database is away); "
                "any that were stay claimed until their shard changes hands",
                sorted(o.id for o in rejected),
            )
            return set()
        except StatementRejected:
            return set()
        return ids

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
