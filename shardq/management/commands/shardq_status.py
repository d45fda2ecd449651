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
from django.db import connection

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


class Command(BaseCommand):
    help = "Show live workers (shards held, heartbeat age, counters), job counts by status and the READY lag."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON document instead of tables.")

    def handle(self, *args, **options):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT w.id::text, w.name, w.host, w.pid, w.state, "
                "(extract(epoch FROM clock_timestamp()) - extract(epoch FROM w.heartbeat_at))::float8, "
                "w.stats::text, "
                "(SELECT count(*) FROM shardq_shard s WHERE s.owner = w.id AND s.lease_expires > clock_timestamp()) "
                "FROM shardq_worker w WHERE w.state <> 'STOPPED' ORDER BY w.started_at"
            )
            workers = [
                {
                    "id": wid,
                    "name": name,
                    "host": host,
                    "pid": pid,
                    "state": state,
                    "heartbeat_age_seconds": _number(round(age, 1) if age is not None else None),
                    "shards": shards,
                    "stats": json.loads(stats) if stats is not None else None,
                }
                for wid, name, host, pid, state, age, stats, shards in cursor.fetchall()
            ]
            cursor.execute("SELECT status, count(*) FROM shardq_job GROUP BY 1 ORDER BY 1")
            jobs = dict(cursor.fetchall())
            cursor.execute(
                "SELECT (extract(epoch FROM clock_timestamp()) - extract(epoch FROM min(run_after)))::float8 "
                "FROM shardq_job WHERE status = 'READY' AND run_after <= clock_timestamp()"
            )
            lag = cursor.fetchone()[0]
            cursor.execute(
                "SELECT count(*) FROM shardq_shard WHERE owner IS NULL OR lease_expires <= clock_timestamp()"
            )
            unowned = cursor.fetchone()[0]
        if options["json"]:
            # json.dumps escapes control characters (and, by default, all non-ASCII).
            self.stdout.write(
                json.dumps(
                    {"workers": workers, "jobs": jobs, "oldest_ready_seconds": _number(lag), "unowned_shards": unowned},
                    indent=2,
                    allow_nan=False,
                )
            )
            return
        self.stdout.write(f"{'worker':38} {'host:pid':24} {'state':9} {'shards':>6} {'heartbeat':>9}  counters")
        for w in workers:
            stats = w["stats"]
            if isinstance(stats, dict):
                counters = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(stats.items()) if v)
            else:  # an odd row: the raw value
                counters = json.dumps(stats, ensure_ascii=False)
            age = w["heartbeat_age_seconds"]
            # The --worker-id name, when one was given, next to the uuid.
            label = printable(w["id"]) + (f" ({printable(w['name'])})" if w["name"] else "")
            self.stdout.write(
                f"{label:38} {printable(w['host']) + ':' + str(w['pid']):24} {printable(w['state']):9} "
                f"{w['shards']:>6} {printable(age):>8}s  {printable(counters)}"
            )
        self.stdout.write(f"unowned shards: {unowned}")
        self.stdout.write("jobs: " + (", ".join(f"{printable(k)} {v}" for k, v in jobs.items()) or "none"))
        self.stdout.write(
            f"oldest due READY job waits: {_seconds_text(lag)}" if lag is not None else "no READY job is due"
        )
