"""``manage.py shardq_status``: workers, shard ownership, counters and lag.

Rows are read as they are, odd ones included (an infinite timestamp, a
``stats`` that is not an object, an unknown status): they are printed, never
a traceback. Ages are taken between epochs, so an infinite timestamp gives
±Infinity rather than PostgreSQL's "cannot subtract infinite timestamps".
Everything printed from a row goes through ``printable``: a host name with a
terminal escape sequence shows the escape, it does not reach the terminal.
"""

import json
import math

from django.core.management.base import BaseCommand

from ...conf import get_config
from ...core import pools
from ...db import operations
from ...fairness import fair_key_report
from ...limits import limit_report
from ...queues import queue_states
from ..flags import printable


def _number(value):
    """A float for JSON: ±Infinity and NaN (odd rows) as strings, since JSON has no such number."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _seconds_text(value) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return printable(value)
    return f"{value:.1f}s"


# What to do about each kind of silent row (status_silent_rows).
SILENT_ROW_ADVICE = {
    "shard out of range": "no lease covers their shard: fix the rows' shard, or retry them from the admin "
    "after correcting it, or delete them",
    "WAITING on nothing": "no parent is left to move them on: set them READY, or cancel or delete them",
}


def silent_rows(shard_count: int) -> list[dict]:
    """Unfinished jobs no worker will ever run (``status_silent_rows``):
    reason, count, up to 10 ids and what to do."""
    return [
        {"reason": reason, "count": count, "ids": list(ids or []), "what_to_do": SILENT_ROW_ADVICE.get(reason, "")}
        for reason, count, ids in operations.run("status_silent_rows", {"shard_count": shard_count})
    ]


# The worker table's columns: (header, the narrowest width, right-aligned).
# A column is as wide as its longest cell (a long --worker-id name, a long
# host), so the columns after it stay aligned.
_COLUMNS = (
    ("worker", 38, False),
    ("host:pid", 24, False),
    ("pool", 16, False),
    ("liveness", 9, False),
    ("state", 9, False),
    ("shards", 6, True),
    ("heartbeat", 9, True),
)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """The header and ``rows`` (one cell per column, then the counters) as aligned lines."""
    widths = [
        max([minimum, len(header), *(len(row[i]) for row in rows)]) for i, (header, minimum, _) in enumerate(_COLUMNS)
    ]

    def line(cells: tuple[str, ...]) -> str:
        padded = (
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, (_, _, right) in zip(cells, widths, _COLUMNS, strict=False)
        )
        return " ".join(padded) + "  " + cells[-1]

    return [line((*(header for header, _, _ in _COLUMNS), "counters")), *(line(row) for row in rows)]


class Command(BaseCommand):
    help = (
        "Show workers (live, stopping or dead; shards held, heartbeat age, counters), job counts by status "
        "and the READY lag."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON document instead of tables.")

    def handle(self, *args, **options):
        config = get_config()
        # Liveness is worker_liveness, the definition the admin's worker list uses.
        workers = [
            {
                "id": wid,
                "name": name,
                "host": host,
                "pid": pid,
                "pool": pool,
                "state": state,
                "liveness": liveness,
                "heartbeat_age_seconds": _number(round(age, 1) if age is not None else None),
                "shards": shards,
                "stats": json.loads(stats) if stats is not None else None,
            }
            for wid, name, host, pid, pool, state, liveness, age, stats, shards in operations.run(
                "status_workers", {"ttl": config.lease_ttl_seconds}
            )
        ]
        jobs = dict(operations.run("status_jobs"))
        # Finished jobs moved out of shardq_job (docs/architecture.md, "History"):
        # an estimate, never a count(*) of millions of rows.
        rows_estimate, partitions, history_from, history_to = operations.run("history_estimate", fetch="one")
        history = {
            "estimated_jobs": rows_estimate,
            "partitions": partitions,
            "finished_from": history_from.isoformat() if history_from else None,
            "finished_to": history_to.isoformat() if history_to else None,
            "archiver": "on" if config.history is not None else "off (SHARDQ['HISTORY'] is False)",
        }
        (lag,) = operations.run("status_lag", fetch="one")
        every_pool = [
            {"pool": pool, "workers": live, "shards_held": held, "unowned_shards": unowned}
            for pool, live, held, unowned in operations.run(
                "status_pools", {"ttl": config.lease_ttl_seconds, "shard_count": config.shard_count}
            )
        ]
        due_queues = operations.run("status_due_queues")
        silent = silent_rows(config.shard_count)
        # Concurrency and rate limits (docs/limits.md): capacity, in use, who
        # holds slots, waiting jobs.
        limits = limit_report()
        # Durable jobs suspended (asleep, or waiting for a signal), by task.
        suspended = [
            {
                "task": task_path,
                "jobs": count,
                "waiting_for_a_signal_with_no_timeout": no_timeout,
                "next_wake": next_wake.isoformat() if next_wake is not None else None,
            }
            for task_path, count, no_timeout, next_wake in operations.run("status_suspended")
        ]
        # Fair share inside a queue (docs/fairness.md): the top fair keys of each queue.
        fair_keys = fair_key_report()
        # Live queue controls (docs/operations.md): the queues paused or with
        # a concurrency override.
        controls = [s for s in queue_states() if s.paused or s.concurrency is not None]
        # The pools that have a live worker; with none, the pool a worker with
        # no flags would join (its shards are all unowned: nothing runs).
        pools_shown = [p for p in every_pool if p["workers"]] or [p for p in every_pool if p["pool"] == pools.ALL]
        unowned = sum(p["unowned_shards"] for p in pools_shown)
        live_pools = [p["pool"] for p in every_pool if p["workers"]]
        unserved = {
            f"{queue}" if backend == pools.DEFAULT_BACKEND else f"{queue}@{backend}": count
            for backend, queue, count in due_queues
            if not any(pools.pool_serves(pool, queue, backend) for pool in live_pools)
        }
        if options["json"]:
            # json.dumps escapes control characters (and, by default, all non-ASCII).
            self.stdout.write(
                json.dumps(
                    {
                        "workers": workers,
                        "pools": pools_shown,
                        "jobs": jobs,
                        "history": history,
                        "oldest_ready_seconds": _number(lag),
                        "unowned_shards": unowned,
                        # Due READY jobs by queue that no live worker's pool serves.
                        "unserved_queues": unserved,
                        "limits": limits,
                        "suspended": suspended,
                        # Unfinished jobs no worker will ever run, by reason.
                        "silent_rows": silent,
                        "fair_keys": fair_keys,
                        "queue_controls": [
                            {
                                "queue": s.queue_name,
                                "paused": s.paused,
                                "concurrency": s.concurrency,
                                "updated_by": s.updated_by,
                                "updated_at": s.updated_at.isoformat() if s.updated_at else None,
                            }
                            for s in controls
                        ],
                    },
                    indent=2,
                    allow_nan=False,
                )
            )
            return
        rows: list[tuple[str, ...]] = []
        for w in workers:
            stats = w["stats"]
            if isinstance(stats, dict):
                counters = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(stats.items()) if v)
            else:  # an odd row: the raw value
                counters = json.dumps(stats, ensure_ascii=False)
            # The --worker-id name, when one was given, next to the uuid.
            label = printable(w["id"]) + (f" ({printable(w['name'])})" if w["name"] else "")
            rows.append(
                (
                    label,
                    f"{printable(w['host'])}:{w['pid']}",
                    printable(w["pool"]),
                    printable(w["liveness"]),
                    printable(w["state"]),
                    str(w["shards"]),
                    f"{printable(w['heartbeat_age_seconds'])}s",
                    printable(counters),
                )
            )
        for line in _table(rows):
            self.stdout.write(line)
        by_liveness = {k: sum(w["liveness"] == k for w in workers) for k in ("live", "stopping", "dead")}
        self.stdout.write(
            f"workers: {by_liveness['live']} live, {by_liveness['stopping']} stopping, {by_liveness['dead']} dead "
            f"(dead: no heartbeat for longer than LEASE_TTL = {config.lease_ttl_seconds:g} s; its shards are "
            "taken over)"
        )
        for p in pools_shown:
            self.stdout.write(
                f"pool {printable(p['pool'])}: {p['workers']} live worker(s), {p['shards_held']} shards held, "
                f"{p['unowned_shards']} unowned"
            )
        self.stdout.write(f"unowned shards: {unowned}")
        if unserved:
            self.stdout.write(
                "due READY jobs that no live worker's pool serves: "
                + ", ".join(f"{printable(q)} {n}" for q, n in unserved.items())
                + " (start a worker whose --queues include them)"
            )
        for row in silent:
            self.stdout.write(
                f"jobs no worker will ever run ({row['reason']}): {row['count']}, e.g. ids "
                + ", ".join(map(str, row["ids"]))
                + f" ({row['what_to_do']})"
            )
        for s in controls:
            parts = ["paused" if s.paused else "running"]
            if s.concurrency is not None:
                parts.append(f"at most {s.concurrency} per worker")
            self.stdout.write(
                f"queue {printable(s.queue_name)}: {', '.join(parts)} (manage.py shardq_queue; by "
                f"{printable(s.updated_by) or '?'})"
            )
        for lim in limits:
            cap = "?" if lim["max_concurrency"] is None else lim["max_concurrency"]
            parts = [f"limit {printable(lim['key'])} ({lim['kind']}):"]
            if lim["max_concurrency"] is not None or not lim["rate_limit"]:
                parts.append(f"{lim['in_use']}/{cap} running")
            if lim["rate_limit"]:
                parts.append(f"rate {lim['rate_limit']} (burst {lim['burst']}, {lim['tokens_now']} tokens now)")
            parts.append(f"{lim['waiting']} waiting")
            if lim["holders"]:
                parts.append("held by " + ", ".join(f"{printable(w)} {n}" for w, n in sorted(lim["holders"].items())))
            self.stdout.write(" ".join(parts))
        for queue in fair_keys:
            self.stdout.write(
                f"fair keys of queue {printable(queue['queue'])}: "
                + "; ".join(
                    f"{printable(k['key'])} {k['backlog']} waiting"
                    + (f" (oldest {_seconds_text(k['oldest_seconds'])})" if k["oldest_seconds"] is not None else "")
                    + f", {k['starts_share']:.0%} of starts and {k['time_share']:.0%} of worker time in the last minute"
                    for k in queue["keys"]
                )
            )
        self.stdout.write("jobs: " + (", ".join(f"{printable(k)} {v}" for k, v in jobs.items()) or "none"))
        self.stdout.write(
            f"history: about {history['estimated_jobs']} finished jobs in {history['partitions']} partitions"
            + (f" (finished {history_from:%Y-%m-%d %H:%M} to {history_to:%Y-%m-%d %H:%M} UTC)" if history_from else "")
            + f"; archiver {history['archiver']}"
        )
        for entry in suspended:
            wake = f"next wakes {entry['next_wake']}" if entry["next_wake"] else "none wakes by time"
            self.stdout.write(
                f"suspended {printable(entry['task'])}: {entry['jobs']} "
                f"({entry['waiting_for_a_signal_with_no_timeout']} wait for a signal with no timeout; {wake})"
            )
        self.stdout.write(
            f"oldest due READY job waits: {_seconds_text(lag)}" if lag is not None else "no READY job is due"
        )
