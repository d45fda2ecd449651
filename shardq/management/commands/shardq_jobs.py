"""``manage.py shardq_jobs retry|cancel|discard|run-now``: act on every job
matching the flags, in batches beside running workers (shardq/bulk.py).

    manage.py shardq_jobs retry --status FAILED --queue emails --older-than 1h
    manage.py shardq_jobs cancel --task myapp.tasks.send_digest --dry-run
    manage.py shardq_jobs run-now --queue reports
    manage.py shardq_jobs retry --tag billing --dead-letter

Each action applies only to jobs in the statuses it can act on (retry and
discard: FAILED; cancel: unfinished; run-now: READY and not due yet), so a
``--status`` outside them matches nothing and is refused. Every batch is its
own transaction, checked again against each job's status as it is written.
"""

import getpass
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db.models import F, Q
from django.db.models.functions import Now

from ... import bulk
from ...core.tags import normalize_tags
from ...models import Job
from ...search import tags_filter
from ..flags import printable, whole_number
from ..progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from .shardq_prune import parse_duration

STATUSES = ("READY", "CLAIMED", "RUNNING", "WAITING", "SUSPENDED", "SUCCESSFUL", "FAILED")


class Command(BaseCommand):
    help = (
        "Retry, cancel, discard or run now every job matching --task/--status/--queue/--tag/--older-than, in batches."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=list(bulk.ACTIONS), help="What to do to every matching job.")
        parser.add_argument("--task", action="append", default=[], help="A task path (repeat for several).")
        parser.add_argument("--status", action="append", default=[], help="A status (repeat for several).")
        parser.add_argument("--queue", action="append", default=[], help="A queue name (repeat for several).")
        parser.add_argument(
            "--tag", action="append", default=[], help="Only jobs carrying this tag (repeat: every one of them)."
        )
        parser.add_argument(
            "--older-than", help="Only jobs enqueued longer ago than this: e.g. 30m, 12h, 7d (default: any age)."
        )
        parser.add_argument("--dead-letter", action="store_true", help="Only dead letters (FAILED, attempts used up).")
        parser.add_argument("--batch", default=str(bulk.DEFAULT_BATCH), help="Jobs a transaction (1-100000).")
        parser.add_argument("--dry-run", action="store_true", help="Count the matching jobs; change nothing.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, **options):
        action = bulk.ACTIONS[options["action"]]
        batch = whole_number("batch", options["batch"], 1, bulk.MAX_BATCH)
        statuses = [s.strip().upper() for s in options["status"]]
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown:
            raise CommandError(f"--status {printable(unknown[0])!r} is not a job status: one of {', '.join(STATUSES)}.")
        outside = [s for s in statuses if s not in action.statuses]
        if outside:
            raise CommandError(
                f"{action.name} acts only on jobs in {', '.join(action.statuses)}; --status {', '.join(outside)} "
                "would match nothing here."
            )
        queryset = Job.objects.all()
        parts = []
        if options["task"]:
            queryset = queryset.filter(task_path__in=options["task"])
            parts.append("task=" + ",".join(options["task"]))
        if statuses:
            queryset = queryset.filter(status__in=statuses)
            parts.append("status=" + ",".join(statuses))
        if options["queue"]:
            queryset = queryset.filter(queue_name__in=options["queue"])
            parts.append("queue=" + ",".join(options["queue"]))
        if options["tag"]:
            try:
                tags = normalize_tags(options["tag"], "--tag")
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            queryset = queryset.filter(tags_filter(tags))
            parts.append("tag=" + ",".join(tags))
        if options["older_than"]:
            age: timedelta = parse_duration(options["older_than"])
            queryset = queryset.filter(enqueued_at__lt=Now() - age)
            parts.append(f"older-than={options['older_than']}")
        if options["dead_letter"]:
            queryset = queryset.filter(Q(status="FAILED") & Q(attempts__gte=F("max_attempts")))
            parts.append("dead-letter")
        filter_text = " ".join(parts) or "every job"
        total = bulk.count_matching(action, queryset)
        if options["dry_run"]:
            self.stdout.write(f"{total} jobs would be {action.verb} ({filter_text}); nothing changed (--dry-run).")
            return
        if not total:
            self.stdout.write(f"no job matches ({filter_text}); nothing to do.")
            return
        try:
            by = "shell:" + getpass.getuser()
        except Exception:  # no user name for this uid
            by = "shell"
        operation = bulk.start(action, filter_text, total, by)
        progress = Progress(
            TextColumn(f"{action.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
            disable=options["no_progress"],
        )
        bar = progress.add_task(action.name, total=total)
        error = None
        try:
            with progress:
                result = bulk.run(
                    action,
                    queryset,
                    batch=batch,
                    operation_id=operation,
                    progress=lambda r: progress.update(bar, completed=r.matched),
                )
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            bulk.finish(operation, error)
        self.stdout.write(
            f"{result.done} jobs {action.verb}, {result.skipped} skipped (no longer "
            f"{' or '.join(action.statuses)} when written) of {result.matched} matching ({filter_text}); "
            f"operation #{operation}."
        )
