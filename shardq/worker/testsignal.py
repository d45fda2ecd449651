"""Test signals: hooks the stages call at their milestones, free in production
and awaited in tests (River's ``rivershared/testsignal``).

A stage calls ``signal(value)`` where something a test may wait for has
happened (a claim buffered jobs, a start write committed, an outcome was
queued, an ack landed). Until a test calls ``init()`` a signal holds no
queue, and ``signal`` is one attribute read and a comparison: a worker
never pays more. After ``init()`` each value is queued, and the test takes
them in order with ``wait()`` (or checks none came with ``require_empty()``)
instead of polling the table or sleeping.

The stages' signals live together on the pipeline (``Pipeline.signals``),
so a test that built the stages (tests/helpers.py ``stepped_worker``) turns
them all on at once with ``PipelineSignals.init()``.
"""

import queue
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .jobs import ClaimedJob, Outcome


class TestSignal[T]:
    """One milestone of one stage (see the module docstring)."""

    __test__ = False  # not a pytest test class, though tests import it
    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue.Queue[T] | None = None

    def init(self, maxsize: int = 100_000) -> None:
        """Start recording (tests only). A full queue raises in the stage
        that signals: a test that turns signals on takes what they send."""
        self._queue = queue.Queue(maxsize)

    def signal(self, value: T) -> None:
        q = self._queue
        if q is not None:
            q.put_nowait(value)

    def wait(self, timeout: float = 10.0) -> T:
        """The next value signalled; AssertionError if none came within ``timeout`` seconds."""
        if self._queue is None:
            raise RuntimeError("this test signal was never initialised: call init() first")
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no test signal within {timeout}s") from None

    def taken(self) -> list[T]:
        """Every value signalled and not yet taken, without waiting."""
        if self._queue is None:
            raise RuntimeError("this test signal was never initialised: call init() first")
        values = []
        while True:
            try:
                values.append(self._queue.get_nowait())
            except queue.Empty:
                return values

    def require_empty(self) -> None:
        """AssertionError naming the value if anything was signalled and not taken."""
        left = self.taken()
        if left:
            raise AssertionError(f"test signal not empty: {left[:5]}{' ...' if len(left) > 5 else ''}")


@dataclass(frozen=True, slots=True)
class PipelineSignals:
    """The milestones of a job through one worker's stages."""

    # Each value is what the stage has at hand (nothing is built for the
    # signal: it costs the same whether a test listens or not).

    #: The fetcher buffered the jobs of one claim: the ``ClaimedJob``s.
    claimed: "TestSignal[list[ClaimedJob]]" = field(default_factory=TestSignal)
    #: One start write committed: the ids it made RUNNING (a group of threads).
    started: "TestSignal[Collection[int]]" = field(default_factory=TestSignal)
    #: An executor queued an ``Outcome`` for the completer.
    finished: "TestSignal[Outcome]" = field(default_factory=TestSignal)
    #: The completer wrote one batch: the (job id, rank) pairs that landed.
    written: "TestSignal[set[tuple[int, int]]]" = field(default_factory=TestSignal)

    def init(self) -> None:
        for each in fields(self):
            getattr(self, each.name).init()
