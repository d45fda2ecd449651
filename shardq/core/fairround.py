"""The fetcher's side of the claim's fair round (docs/fairness.md, "The claim").

The claim (``claim_fair`` in shardq/db/sql/job.sql) walks the fair keys of
every shard a worker holds in byte order, starting after the last key the
worker took and going round from the first key up to it, and takes each key
once. ``FairRound`` keeps what the next claim needs from the last ones:

* ``after``: the last key of the round taken (the next claim starts after
  it). Python orders strings by code point, which is the byte order of their
  UTF-8 (the index's ``COLLATE "C"``);
* whether the claim goes by the round at all (``due``): until ``memory``
  fair jobs came with no key twice among them (a backlog where every job is
  its own key, which FIFO slices serve as fairly and more cheaply), and
  again from any claim that brings a key seen among the last ``memory``;
* ``weights``: the weights other than 1 of the keys claimed lately (the
  round shares its batch out by them).

Pure: no clock, no I/O; the fetcher's thread alone calls it.
"""

from collections.abc import Iterable

# The round runs until this many fair jobs were claimed with no key twice.
FAIR_MEMORY = 4096


class FairRound:
    def __init__(self, memory: int = FAIR_MEMORY) -> None:
        self.memory = memory
        self.after = ""
        self.weights: dict[str, float] = {}
        # The keys of the last ``memory`` fair jobs claimed, oldest first.
        self._seen: dict[str, None] = {}
        # Fair jobs claimed since a key came twice. From the start the round
        # runs: a first claim by FIFO slices gave a backlog's first tenants
        # a job on every shard.
        self._since_repeat = 0

    @property
    def due(self) -> bool:
        """Go by the round (a key came twice lately, or not enough fair jobs
        came yet to say that none does)?"""
        return self._since_repeat < self.memory

    def claimed(self, jobs: Iterable[tuple[str, float]], walked: bool) -> None:
        """A claim brought these fair jobs, (key, weight) each; ``walked``:
        by the round."""
        jobs = list(jobs)
        if not jobs:
            return
        keys = {key for key, _ in jobs}
        if walked:
            # The round took the keys after the turn, then, once past the
            # last key, those up to it: the turn is the last key taken.
            wrapped = [key for key in keys if key <= self.after]
            self.after = max(wrapped) if wrapped else max(keys)
        seen, weights = self._seen, self.weights
        self._since_repeat += len(jobs)
        repeated = False
        for key, weight in jobs:
            if weight != 1.0:
                weights[key] = weight
            else:
                weights.pop(key, None)
            if key in seen:
                repeated = True
                del seen[key]
            seen[key] = None
        if repeated:
            self._since_repeat = 0
        while len(seen) > self.memory:
            gone = next(iter(seen))
            del seen[gone]
            weights.pop(gone, None)
