"""The road not taken (issue 17, part 5): shard -> worker assignment by a
consistent-hash ring against shardq's lease table, simulated.

    .venv/bin/python bench/assignment.py [--trials 50] [--keys 100000] [--json PATH]

Both models place the same keys: a key's shard is ``key_hash & (S - 1)``
with shardq's own hash (``shardq.core.hashing.shard_key_hash``), so the keys
a worker serves are the keys of the shards it holds; only the shard -> worker
step differs.

* **ring** (100 or 200 virtual nodes a worker): each worker puts ``vnodes``
  points on a 32-bit ring at ``mmh3("<worker>#<i>")``, each shard sits at
  ``mmh3("shard:<s>")``, and a shard belongs to the first worker point at or
  after it (wrapping). No coordination, no table: every process computes the
  same map from the member list. The row "keys" hashes the keys themselves
  onto the ring (no shards at all): the ring's best case.
* **lease** (what shardq does, ``shardq/worker/leaser.py``): the live workers
  in start order; each one's share is ``fair_share()`` -- the very function
  the leaser calls -- ``S // W``, plus one for the first ``S % W`` workers.
  Every lease round (workers in a random order) a worker above its share
  releases its highest-numbered shards, and a worker below it claims free or
  expired shards lowest-numbered first (``claim_shards``: ``ORDER BY shard
  LIMIT wanted``), until nothing changes. A joiner registers last in start
  order; a dead worker's shards expire and it leaves the live list.

Worker names are fresh UUIDs (a worker incarnation's id), drawn from a seeded
generator, a new set each trial; the dying worker is drawn at random too.
Figures are means over the trials, with the worst trial where it matters
(the ring's balance depends on where the names happen to land).

Load is counted in keys (what a worker's share of the traffic is when keys
are equally busy); "moved" is the share of keys whose worker changed.
"""

import argparse
import bisect
import json
import random
import statistics
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import mmh3

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shardq.core.hashing import shard_for, shard_key_hash
from shardq.worker.leaser import fair_share

#: The transitions issue 17 names: two joins and a death.
TRANSITIONS = ((4, 5), (16, 17), (64, 63))
SHARD_COUNTS = (64, 256, 1024)
MODELS = ("ring-100", "ring-200", "lease")


def point(label: str) -> int:
    """A position on the 32-bit ring."""
    return mmh3.hash(label, 0, signed=False)


# -- the two assignment models -----------------------------------------------


class Ring:
    """A consistent-hash ring with ``vnodes`` points a worker."""

    def __init__(self, vnodes: int, workers: Sequence[str] = ()) -> None:
        self.vnodes = vnodes
        self.points: list[tuple[int, str]] = []
        for worker in workers:
            self.join(worker)

    def join(self, worker: str) -> None:
        for i in range(self.vnodes):
            bisect.insort(self.points, (point(f"{worker}#{i}"), worker))

    def leave(self, worker: str) -> None:
        self.points = [p for p in self.points if p[1] != worker]

    def owners(self, positions: Sequence[int]) -> list[str]:
        """The owner of each item at ``positions`` (sorted ascending): the
        first point at or after it, wrapping; one merge pass."""
        owners = []
        points = self.points
        i = 0
        for position in positions:
            while i < len(points) and points[i][0] < position:
                i += 1
            owners.append(points[i][1] if i < len(points) else points[0][1])
        return owners


class LeaseTable:
    """shardq's static partitions: live workers in start order, fair shares,
    releases from the top and claims from the bottom (see the module
    docstring)."""

    def __init__(self, shard_count: int, rng: random.Random) -> None:
        self.shard_count = shard_count
        self.rng = rng
        self.live: list[str] = []  # start order
        self.owner: list[str | None] = [None] * shard_count
        self.holdings: dict[str, set[int]] = {}
        self.rounds = 0  # lease rounds the last change took to settle

    def held(self, worker: str) -> list[int]:
        return sorted(self.holdings.get(worker, ()))

    def join(self, worker: str) -> None:
        self.live.append(worker)
        self.holdings[worker] = set()
        self.settle()

    def die(self, worker: str) -> None:
        """Its leases expire and its heartbeat ages out of the live list."""
        self.live.remove(worker)
        for shard in self.holdings.pop(worker):
            self.owner[shard] = None
        self.settle()

    def settle(self) -> None:
        self.rounds = 0
        while self.lease_round():
            self.rounds += 1
            if self.rounds > 10 * len(self.live) + 10:
                raise RuntimeError("the lease table does not settle")

    def lease_round(self) -> bool:
        """One heartbeat of every live worker, in a random order. Changed?"""
        changed = False
        for worker in self.rng.sample(self.live, len(self.live)):
            share = fair_share(self.shard_count, self.live, worker)
            held = self.held(worker)
            if len(held) > share:
                for shard in held[share:]:  # the highest-numbered ones
                    self.owner[shard] = None
                    self.holdings[worker].discard(shard)
                changed = True
            elif len(held) < share:
                free = [s for s, o in enumerate(self.owner) if o is None][: share - len(held)]
                for shard in free:
                    self.owner[shard] = worker
                    self.holdings[worker].add(shard)
                changed = changed or bool(free)
        return changed


# -- one trial ------------------------------------------------------------------


@dataclass
class Step:
    """One membership change, as the keys see it."""

    keys_moved: float  # share of all keys whose worker changed
    moved_only_to_joiner_or_from_leaver: bool
    max_over_mean: float  # after the change
    busiest_gain: int  # most keys any survivor gained (0 on a join)
    busiest_gain_shards: int  # the same in shards (ring over keys: 0)
    mean_load_before: float
    lease_rounds: int  # lease rounds to settle (lease model only)


def loads(owners: Sequence[str], weights: Sequence[int], workers: Sequence[str]) -> dict[str, int]:
    load = dict.fromkeys(workers, 0)
    for owner, weight in zip(owners, weights, strict=True):
        load[owner] += weight
    return load


def max_over_mean(load: dict[str, int]) -> float:
    mean = sum(load.values()) / len(load)
    return max(load.values()) / mean


def compare(
    before: Sequence[str],
    after: Sequence[str],
    weights: Sequence[int],
    workers_before: Sequence[str],
    workers_after: Sequence[str],
    rounds: int,
) -> Step:
    total = sum(weights)
    joined = set(workers_after) - set(workers_before)
    left = set(workers_before) - set(workers_after)
    moved = [(b, a, w) for b, a, w in zip(before, after, weights, strict=True) if b != a]
    minimal = all(a in joined or b in left for b, a, _ in moved)
    load_before = loads(before, weights, workers_before)
    load_after = loads(after, weights, workers_after)
    survivors = [w for w in workers_after if w in load_before]
    gain = max((load_after[w] - load_before[w] for w in survivors), default=0) if left else 0
    shards_before = loads(before, [1] * len(before), workers_before)
    shards_after = loads(after, [1] * len(after), workers_after)
    gain_shards = max((shards_after[w] - shards_before[w] for w in survivors), default=0) if left else 0
    return Step(
        keys_moved=sum(w for _, _, w in moved) / total,
        moved_only_to_joiner_or_from_leaver=minimal,
        max_over_mean=max_over_mean(load_after),
        busiest_gain=gain,
        busiest_gain_shards=gain_shards,
        mean_load_before=total / len(workers_before),
        lease_rounds=rounds,
    )


@dataclass
class Trial:
    balance: float  # max/mean with the starting workers
    join: Step  # W -> W+1
    death: Step  # W -> W-1 (one of the starting workers dies)


def names(rng: random.Random, count: int) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


class Keys:
    """``count`` keys as shardq hashes them, with what the models read of them."""

    def __init__(self, count: int) -> None:
        self.hashes = [shard_key_hash(f"key:{i}") for i in range(count)]
        #: The keys themselves on the ring (no shards): unsigned positions, sorted.
        self.positions = sorted(k & 0xFFFFFFFF for k in self.hashes)
        self._per_shard: dict[int, list[int]] = {}

    def per_shard(self, shard_count: int) -> list[int]:
        """How many of the keys each shard holds (``key_hash & (S - 1)``)."""
        if shard_count not in self._per_shard:
            counts = [0] * shard_count
            for k in self.hashes:
                counts[shard_for(k, shard_count)] += 1
            self._per_shard[shard_count] = counts
        return self._per_shard[shard_count]


def trial(model: str, shard_count: int | None, workers: int, keys: Keys, seed: int) -> Trial:
    """``shard_count`` None: the ring places the keys themselves (no shards)."""
    rng = random.Random(seed)
    members = names(rng, workers + 1)
    start, joiner = members[:workers], members[workers]
    dying = rng.choice(start)

    if shard_count is None:
        positions = keys.positions
        weights = [1] * len(positions)
    else:
        per_shard = keys.per_shard(shard_count)
        if model == "lease":
            order = list(range(shard_count))
        else:
            order = sorted(range(shard_count), key=lambda s: point(f"shard:{s}"))
            positions = [point(f"shard:{s}") for s in order]
        weights = [per_shard[s] for s in order]

    def snapshot() -> list[str]:
        if model == "lease":
            return [o or "" for o in table.owner]
        return ring.owners(positions)

    if model == "lease":
        if shard_count is None:
            raise ValueError("the lease table assigns shards: give a shard count")
        table = LeaseTable(shard_count, rng)
        for worker in start:
            table.join(worker)
    else:
        ring = Ring(int(model.split("-")[1]), start)
    before = snapshot()
    balance = max_over_mean(loads(before, weights, start))

    if model == "lease":
        table.join(joiner)
    else:
        ring.join(joiner)
    joined = snapshot()
    join = compare(before, joined, weights, start, [*start, joiner], table.rounds if model == "lease" else 0)

    if model == "lease":
        table = LeaseTable(shard_count, rng)  # type: ignore[arg-type]
        for worker in start:
            table.join(worker)
        table.die(dying)
    else:
        ring = Ring(int(model.split("-")[1]), start)
        ring.leave(dying)
    survivors = [w for w in start if w != dying]
    died = snapshot()
    death = compare(before, died, weights, start, survivors, table.rounds if model == "lease" else 0)
    return Trial(balance=balance, join=join, death=death)


# -- the table ------------------------------------------------------------------


def summarize(trials: Sequence[Trial]) -> dict:
    def col(get):
        values = [get(t) for t in trials]
        return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}

    return {
        "balance": col(lambda t: t.balance),
        "join_moved": col(lambda t: t.join.keys_moved),
        "join_minimal": all(t.join.moved_only_to_joiner_or_from_leaver for t in trials),
        "join_balance": col(lambda t: t.join.max_over_mean),
        "death_moved": col(lambda t: t.death.keys_moved),
        "death_minimal": all(t.death.moved_only_to_joiner_or_from_leaver for t in trials),
        "death_balance": col(lambda t: t.death.max_over_mean),
        "death_gain": col(lambda t: t.death.busiest_gain / t.death.mean_load_before),
        "death_gain_shards": col(lambda t: t.death.busiest_gain_shards),
        "lease_rounds": col(lambda t: max(t.join.lease_rounds, t.death.lease_rounds)),
        "trials": [asdict(t) for t in trials],
    }


def run(
    shard_counts: Sequence[int | None], transitions: Sequence[tuple[int, int]], trials: int, key_count: int
) -> list[dict]:
    keys = Keys(key_count)
    rows = []
    for shard_count in shard_counts:
        for before, after in transitions:
            # A transition W -> W+1 is the join of the W workers' run; W -> W-1
            # is the death of theirs. Both are simulated from W for every row.
            workers = before
            for model in MODELS:
                if shard_count is None and model == "lease":
                    continue
                if shard_count is not None and workers > shard_count:
                    continue
                summary = summarize([trial(model, shard_count, workers, keys, seed) for seed in range(trials)])
                rows.append({"shards": shard_count, "workers": workers, "after": after, "model": model, **summary})
    return rows


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def markdown(rows: Sequence[dict]) -> str:
    out = [
        "| shards | change | model | keys moved (ideal) | max/mean after: mean (worst) "
        "| one of W dies: busiest survivor gains, × mean load: mean (worst) | in shards: mean (worst) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        w, after = row["workers"], row["after"]
        joining = after > w
        moved = row["join_moved"] if joining else row["death_moved"]
        balance = row["join_balance"] if joining else row["death_balance"]
        ideal = 1 / after if joining else 1 / w
        shards = "keys" if row["shards"] is None else str(row["shards"])
        gain_shards = (
            "–"
            if row["shards"] is None
            else f"{row['death_gain_shards']['mean']:.1f} ({row['death_gain_shards']['max']})"
        )
        out.append(
            f"| {shards} | {w} → {after} | {row['model']} | {pct(moved['mean'])} ({pct(ideal)}) "
            f"| {balance['mean']:.2f} ({balance['max']:.2f}) "
            f"| {row['death_gain']['mean']:.2f} ({row['death_gain']['max']:.2f}) | {gain_shards} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="worker-name sets per row (default 50)")
    parser.add_argument("--keys", type=int, default=100_000, help="keys placed (default 100000)")
    parser.add_argument("--json", type=Path, help="also write every trial here")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.keys < 1:
        parser.error("--trials and --keys must be at least 1")
    rows = run([*SHARD_COUNTS, None], TRANSITIONS, args.trials, args.keys)
    print(
        f"{args.keys:,} keys, {args.trials} trials a row; a join adds a worker to W, a death removes one of W; "
        "'ideal' is the least any balanced scheme moves"
    )
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
