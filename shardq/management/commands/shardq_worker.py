"""``manage.py shardq_worker``: run jobs (see shardq/worker/runtime.py)."""

import errno
import logging
import os
import signal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.tasks.base import DEFAULT_TASK_QUEUE_NAME
from django.utils.module_loading import import_string

from shardq.conf import DEFAULTS
from shardq.management.flags import printable, seconds, whole_number
from shardq.pooling import worker_database

# The range of each numeric flag (shardq.management.flags): a value out of
# it is a CommandError naming the flag, before anything starts.
MAX_PROCESSES = 256
MAX_CONCURRENCY = 1024
MAX_GRACE_SECONDS = 86400.0
MAX_PREFETCH = 100_000
MAX_TASKS = 1_000_000_000
MAX_PORT = 65535
DEFAULT_METRICS_ADDRESS = DEFAULTS["METRICS_ADDRESS"]
# --worker-id: the length of shardq_worker.name.
MAX_WORKER_ID_LENGTH = 100

logger = logging.getLogger("shardq.worker")


class Command(BaseCommand):
    help = "Run a shardq worker: claim shards, run their jobs, write fenced outcomes."

    def add_arguments(self, parser):
        parser.add_argument(
            "--backend",
            default="default",
            help="The TASKS alias to serve: only its jobs are claimed (default 'default').",
        )
        parser.add_argument("--queues", default=None, help="Comma-separated queue names (default: every queue).")
        parser.add_argument(
            "--exclude-queues",
            default=None,
            help="Comma-separated queue names to leave alone: serve every other queue.",
        )
        parser.add_argument("--concurrency", default="4", help="Threads for sync tasks per process (default 4).")
        parser.add_argument(
            "--processes",
            default=None,
            help="Worker processes under a supervisor that starts a fresh one when one crashes: a number "
            "(1 included) or 'auto' (one per core). Default: one worker in this process, no supervisor "
            "(for a process manager that restarts it).",
        )
        parser.add_argument("--grace", default="30", help="Seconds to let running jobs finish on SIGTERM (default 30).")
        parser.add_argument(
            "--prefetch",
            default="0",
            help="Most jobs buffered ahead per process; how many are used follows the "
            "measured task time (default 512).",
        )
        parser.add_argument(
            "--max-tasks",
            default=None,
            help="Stop gracefully (exit 0) once this many jobs finished here; with "
            "--processes, per process (default: no limit).",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="A readable name shown in the logs and shardq_status next to the worker's uuid.",
        )
        parser.add_argument(
            "--metrics-port",
            default=None,
            help="Serve Prometheus metrics on this port (one port for all --processes); "
            "default SHARDQ['METRICS_PORT'], unset: no metrics.",
        )
        parser.add_argument(
            "--metrics-address",
            default=None,
            help="The address --metrics-port binds (default SHARDQ['METRICS_ADDRESS'], else 127.0.0.1: "
            "this host only); 0.0.0.0 or :: for every interface.",
        )

    def handle(self, *args, **options):
        # The stop rule first (shardq/worker/shutdown.py): a SIGTERM that comes
        # while the worker is still being built is a graceful stop, applied
        # once it exists, not the default action (killed, exit -15).
        from shardq.worker import logs, shutdown

        shutdown.install()
        logs.ensure_output()
        logs.dump_stacks_on(signal.SIGUSR1)
        logs.tidy_django_task_log()
        alias = options["backend"]
        config = shardq_backend_config(alias)
        queues, exclude_queues = served_queues(alias, config, options["queues"], options["exclude_queues"])
        concurrency = whole_number("concurrency", options["concurrency"], maximum=MAX_CONCURRENCY)
        # --processes N, 1 included, runs N children under the supervisor;
        # without it the worker runs in this process (supervised = False).
        supervised = options["processes"] is not None
        if options["processes"] is None:
            processes = 1
        elif options["processes"] == "auto":
            processes = os.cpu_count() or 1
        else:
            # Checked before anything is forked: --processes 10000000000 is an error, not a fork bomb.
            processes = whole_number(
                "processes", options["processes"], maximum=MAX_PROCESSES, also="'auto' (one per core)"
            )
        grace = seconds("grace", options["grace"], 0, MAX_GRACE_SECONDS)
        prefetch = whole_number("prefetch", options["prefetch"], minimum=0, maximum=MAX_PREFETCH)
        max_tasks = None
        if options["max_tasks"] is not None:
            max_tasks = whole_number("max-tasks", options["max_tasks"], maximum=MAX_TASKS)
        name = worker_name(options["worker_id"])
        # SHARDQ["WORKER_DATABASE"]: a direct or session-pooled alias when the
        # backend's goes through a transaction pool (shardq/pooling.py).
        database = worker_database((config.get("OPTIONS") or {}).get("DATABASE", "default"))
        if database not in connections.settings:
            raise CommandError(
                f"SHARDQ['WORKER_DATABASE'] = {printable(repr(database))} is not in DATABASES: name the alias "
                'the worker connects through (docs/scaling.md, "PgBouncer").'
            )
        port = metrics_port(options["metrics_port"])
        check_tables(database)
        # The port is bound here, before any process is forked: a port in use
        # is this command's error, not a child's crash loop.
        endpoint, directory = (
            (None, None)
            if port is None
            else serve_metrics(port, supervised, metrics_address(options["metrics_address"]))
        )

        def run_worker() -> int:
            from shardq.exceptions import DatabaseUnavailable, TablesMissing
            from shardq.worker.runtime import Worker, WorkerOptions

            metrics = None
            if endpoint is not None:
                from shardq.worker import metrics as shardq_metrics

                if directory is not None:
                    endpoint.close_in_child()  # the supervisor serves the group
                metrics = shardq_metrics.enable(multiprocess=directory is not None)
            options = WorkerOptions(
                queues=queues or None,
                concurrency=concurrency,
                grace=grace,
                prefetch=prefetch or None,
                database=database,
                backend=alias,
                exclude_queues=exclude_queues or None,
                max_tasks=max_tasks,
                name=name,
            )
            worker = Worker(options, metrics=metrics)
            worker.install_signal_handlers()
            try:
                return worker.run()
            except (DatabaseUnavailable, TablesMissing) as exc:
                # Unreachable at start (later outages are ridden out): one
                # line, the traceback only for those who asked for DEBUG.
                logger.error("worker %s cannot start: %s", worker.label, exc)
                logger.debug("the traceback of the failed start", exc_info=True)
                return 1

        if supervised:
            from shardq.worker.supervisor import Supervisor

            try:
                code = Supervisor(run_worker, processes, on_exit=directory.child_exited if directory else None).run()
            finally:
                if directory is not None:
                    directory.remove()
        else:
            code = run_worker()
        if code:
            raise SystemExit(code)


def shardq_backend_config(alias: str) -> dict:
    """``TASKS[alias]``, or a CommandError when it is missing or not a shardq backend."""
    from shardq.backend import ShardqBackend

    tasks = getattr(settings, "TASKS", {}) or {}
    config = tasks.get(alias)
    if not isinstance(config, dict):
        raise CommandError(
            f"--backend {printable(alias)!r} names no backend in TASKS "
            f"(the aliases are {', '.join(map(printable, sorted(tasks))) or 'none'})."
        )
    path = config.get("BACKEND", "")
    try:
        backend_class = import_string(path)
    except ImportError:
        backend_class = None
    if not (isinstance(backend_class, type) and issubclass(backend_class, ShardqBackend)):
        raise CommandError(
            f"--backend {printable(alias)!r}: TASKS[{printable(alias)!r}]['BACKEND'] is "
            f"{printable(path)!r}, not a shardq backend (shardq.backend.ShardqBackend)."
        )
    return config


def served_queues(
    alias: str, config: dict, queues_text: str | None, exclude_text: str | None
) -> tuple[list[str], list[str]]:
    """(--queues, --exclude-queues) as lists, each name checked against
    ``TASKS[alias]["QUEUES"]``; an empty QUEUES allows any name, as Django's
    backend does (BaseTaskBackend.validate_task). A flag given with no name
    in it (``--queues "$QUEUE"`` with the variable unset) is refused: left
    out, the worker would serve every queue instead of the one meant."""
    queues = [q.strip() for q in (queues_text or "").split(",") if q.strip()]
    excluded = [q.strip() for q in (exclude_text or "").split(",") if q.strip()]
    for flag, text, names in (("--queues", queues_text, queues), ("--exclude-queues", exclude_text, excluded)):
        if text is not None and not names:
            raise CommandError(
                f"{flag} {printable(text)!r} names no queue: give comma-separated queue names, "
                f"or leave {flag} out to serve every queue."
            )
    starred = [q for q in queues + excluded if q.startswith("*")]
    if starred:
        raise CommandError(
            f"queue name(s) {', '.join(map(printable, starred))} start with '*', which names every queue "
            "(the pool of a worker with no --queues): rename the queue to serve it by name."
        )
    if queues and excluded:
        raise CommandError(
            "--queues and --exclude-queues cannot be used together: "
            "name the queues to serve, or the ones to leave alone."
        )
    configured = set(config.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME]))
    if configured:
        flag = "--queues" if queues else "--exclude-queues"
        unknown = [q for q in queues or excluded if q not in configured]
        if unknown:
            raise CommandError(
                f"{flag} names unknown queue(s) {', '.join(map(printable, unknown))}; the configured queues are "
                f"{', '.join(map(printable, sorted(configured)))} (TASKS[{printable(alias)!r}]['QUEUES'])."
            )
        if excluded and configured <= set(excluded):
            raise CommandError(
                f"--exclude-queues leaves no queue to serve (TASKS[{printable(alias)!r}]['QUEUES'] "
                f"is {', '.join(map(printable, sorted(configured)))})."
            )
    return queues, excluded


def check_tables(database: str) -> None:
    """A CommandError when shardq's tables are missing (manage.py migrate not
    run), before any worker process starts: one sentence, not a traceback
    or a crash loop of --processes. An unreachable database is the worker's
    own start to report (one line, exit 1)."""
    from shardq.db.store import WorkerStore
    from shardq.exceptions import DatabaseUnavailable, TablesMissing

    store = WorkerStore(database, application_name="shardq-check")
    try:
        store.check_tables()
    except TablesMissing as exc:
        raise CommandError(str(TablesMissing(f"{exc.detail}; database {printable(database)!r}")))
    except DatabaseUnavailable:
        pass
    finally:
        store.close()


def metrics_port(flag: str | None) -> int | None:
    """--metrics-port, else SHARDQ["METRICS_PORT"], as a port number (None: no metrics)."""
    if flag is not None:
        return whole_number("metrics-port", flag, minimum=1, maximum=MAX_PORT)
    value = (getattr(settings, "SHARDQ", {}) or {}).get("METRICS_PORT")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PORT:
        raise CommandError(
            f"SHARDQ['METRICS_PORT'] must be a port number from 1 to {MAX_PORT} (or None: no metrics), "
            f"not {printable(repr(value))}."
        )
    return value


def metrics_address(flag: str | None) -> str:
    """--metrics-address, else SHARDQ["METRICS_ADDRESS"], else 127.0.0.1: an
    IP address to bind (a CommandError names a value that is not one)."""
    import ipaddress

    what = "--metrics-address"
    value: object = flag
    if flag is None:
        what = "SHARDQ['METRICS_ADDRESS']"
        value = (getattr(settings, "SHARDQ", {}) or {}).get("METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS)
    try:
        return str(ipaddress.ip_address(value))  # type: ignore[arg-type]
    except ValueError:
        raise CommandError(
            f"{what} must be an IP address to bind the metrics port to, not {printable(repr(value))}: "
            f"{DEFAULT_METRICS_ADDRESS} (the default: this host only), a private interface's address, "
            'or 0.0.0.0 / :: for every interface (docs/operations.md, "Metrics").'
        )


def serve_metrics(port: int, multiprocess: bool, address: str = "127.0.0.1"):
    """(the endpoint listening on ``port``, the multiprocess directory or
    None), or a CommandError: prometheus-client missing, the port in use or
    not ours to bind."""
    from shardq.worker import metrics

    try:
        metrics.import_client()
    except ImproperlyConfigured as exc:
        raise CommandError(f"--metrics-port {port}: {exc}")
    directory = metrics.MultiprocessDirectory() if multiprocess else None
    try:
        registry = directory.registry() if directory else metrics.import_client().REGISTRY
        endpoint = metrics.Endpoint(port, registry, address)
    except OSError as exc:
        if directory:
            directory.remove()
        reason = "is in use by another process" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
        raise CommandError(
            f"--metrics-port {port}: the port {reason} on {address}; choose another (--metrics-port or "
            "SHARDQ['METRICS_PORT']) or another address (--metrics-address or SHARDQ['METRICS_ADDRESS'])."
        )
    return endpoint, directory


def worker_name(value: str | None) -> str | None:
    """--worker-id: 1 to MAX_WORKER_ID_LENGTH printable characters, or a CommandError."""
    if value is None:
        return None
    if not (0 < len(value) <= MAX_WORKER_ID_LENGTH and value.isprintable()):
        raise CommandError(
            f"--worker-id must be 1 to {MAX_WORKER_ID_LENGTH} printable characters "
            f"(no control characters), not {printable(value)!r}."
        )
    return value
