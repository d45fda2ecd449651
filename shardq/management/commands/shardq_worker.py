"""``manage.py shardq_worker``: run jobs (see shardq/worker/runtime.py)."""

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from shardq.management.flags import seconds, whole_number

# The range of each numeric flag (shardq.management.flags): a value out of
# it is a CommandError naming the flag, before anything starts.
MAX_PROCESSES = 256
MAX_CONCURRENCY = 1024
MAX_GRACE_SECONDS = 86400.0
MAX_PREFETCH = 100_000


class Command(BaseCommand):
    help = "Run a shardq worker: claim shards, run their jobs, write fenced outcomes."

    def add_arguments(self, parser):
        parser.add_argument("--queues", default="", help="Comma-separated queue names (default: every queue).")
        parser.add_argument("--concurrency", default="4", help="Threads for sync tasks per process (default 4).")
        parser.add_argument("--processes", default="1", help="Worker processes: a number or 'auto' (one per core). Default 1.")
        parser.add_argument("--grace", default="30", help="Seconds to let running jobs finish on SIGTERM (default 30).")
        parser.add_argument("--prefetch", default="0", help="Most jobs buffered ahead per process; how many are used follows the measured task time (default 512).")

    def handle(self, *args, **options):
        # The stop rule first (shardq/worker/shutdown.py): a SIGTERM that comes
        # while the worker is still being built is a graceful stop, applied
        # once it exists, not the default action (killed, exit -15).
        from shardq.worker import shutdown

        shutdown.install()
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
        known = set(settings.TASKS.get("default", {}).get("QUEUES", ["default"]))
        unknown = [q for q in queues if q not in known]
        if unknown:
            raise CommandError(
                f"--queues names unknown queue(s) {', '.join(unknown)}; the configured queues are "
                f"{', '.join(sorted(known))} (TASKS['default']['QUEUES'])."
            )
        concurrency = whole_number("concurrency", options["concurrency"], maximum=MAX_CONCURRENCY)
        if options["processes"] == "auto":
            processes = os.cpu_count() or 1
        else:
            # Checked before anything is forked: --processes 10000000000 is an error, not a fork bomb.
            processes = whole_number("processes", options["processes"], maximum=MAX_PROCESSES)
        grace = seconds("grace", options["grace"], 0, MAX_GRACE_SECONDS)
        prefetch = whole_number("prefetch", options["prefetch"], minimum=0, maximum=MAX_PREFETCH)

        def run_worker() -> int:
            from shardq.worker.runtime import Worker

            worker = Worker(queues=queues or None, concurrency=concurrency, grace=grace, prefetch=prefetch or None)
            worker.install_signal_handlers()
            return worker.run()

        if processes > 1:
            from shardq.worker.supervisor import Supervisor

            code = Supervisor(run_worker, processes).run()
        else:
            code = run_worker()
        if code:
            raise SystemExit(code)
