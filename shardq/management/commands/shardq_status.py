"""``manage.py shardq_status``: workers, shard ownership, counters and lag."""

import json

from django.core.management.base import BaseCommand
from django.db import connection


class Command(BaseCommand):
    help = "Show live workers (shards held, heartbeat age, counters), job counts by status and the READY lag."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON document instead of tables.")

    def handle(self, *args, **options):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT w.id::text, w.host, w.pid, w.state, "
                "extract(epoch FROM clock_timestamp() - w.heartbeat_at)::float8, w.stats::text, "
                "(SELECT count(*) FROM shardq_shard s WHERE s.owner = w.id AND s.lease_expires > clock_timestamp()) "
                "FROM shardq_worker w WHERE w.state <> 'STOPPED' ORDER BY w.started_at"
            )
            workers = [
                {"id": wid, "host": host, "pid": pid, "state": state, "heartbeat_age_seconds": round(age, 1),
                 "shards": shards, "stats": json.loads(stats)}
                for wid, host, pid, state, age, stats, shards in cursor.fetchall()
            ]
            cursor.execute("SELECT status, count(*) FROM shardq_job GROUP BY 1 ORDER BY 1")
            jobs = dict(cursor.fetchall())
            cursor.execute(
                "SELECT extract(epoch FROM clock_timestamp() - min(run_after))::float8 FROM shardq_job "
                "WHERE status = 'READY' AND run_after <= clock_timestamp()"
            )
            lag = cursor.fetchone()[0]
            cursor.execute("SELECT count(*) FROM shardq_shard WHERE owner IS NULL OR lease_expires <= clock_timestamp()")
            unowned = cursor.fetchone()[0]
        if options["json"]:
            self.stdout.write(json.dumps({"workers": workers, "jobs": jobs, "oldest_ready_seconds": lag,
                                          "unowned_shards": unowned}, indent=2))
            return
        self.stdout.write(f"{'worker':38} {'host:pid':24} {'state':9} {'shards':>6} {'heartbeat':>9}  counters")
        for w in workers:
            counters = ", ".join(f"{k}={v}" for k, v in sorted(w["stats"].items()) if v)
            self.stdout.write(f"{w['id']:38} {w['host'] + ':' + str(w['pid']):24} {w['state']:9} "
                              f"{w['shards']:>6} {w['heartbeat_age_seconds']:>8}s  {counters}")
        self.stdout.write(f"unowned shards: {unowned}")
        self.stdout.write("jobs: " + (", ".join(f"{k} {v}" for k, v in jobs.items()) or "none"))
        self.stdout.write(f"oldest due READY job waits: {lag:.1f}s" if lag is not None else "no READY job is due")
