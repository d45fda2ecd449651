"""``manage.py shardq_worker``: run jobs (see shardq/worker/runtime.py)."""

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from shardq.management.flags import whole_number


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
        concurrency = whole_number("concurrency", options["concurrency"])
        if options["processes"] == "auto":
            processes = os.cpu_count() or 1
        else:
            processes = whole_number("processes", options["processes"])
        try:
            grace = float(options["grace"])
        except ValueError:
            grace = -1.0
        if not grace >= 0:
            raise CommandError(f"--grace must be a number of seconds ≥ 0, not {options['grace']!r}.")
        prefetch = whole_number("prefetch", options["prefetch"], minimum=0)

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
