"""``manage.py shardq_queue``: pause, resume and limit queues live.

    manage.py shardq_queue pause emails       # no worker claims emails' jobs (within 1 s)
    manage.py shardq_queue resume emails
    manage.py shardq_queue concurrency emails 4      # at most 4 of them on each worker at once
    manage.py shardq_queue concurrency emails none   # clear the override
    manage.py shardq_queue list                      # every queue's state

Writes ``shardq_queue_control`` and NOTIFYs every worker (shardq/queues.py,
docs/operations.md "Queue controls"); enqueue keeps working on a paused
queue and running jobs finish.
"""

import getpass
import json

from django.core.management.base import BaseCommand, CommandError

from ... import queues
from ...admin.common import configured_queues
from ..flags import printable, whole_number


def operator() -> str:
    """Who made a change, as the row records it: the shell's user."""
    try:
        return "shell:" + getpass.getuser()
    except Exception:  # no user name for this uid (a container)
        return "shell"


class Command(BaseCommand):
    help = "Pause or resume a queue, set its per-worker concurrency override, or list the queues' state."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{pause,resume,concurrency,list}")
        sub.add_parser("pause", help="Stop every worker claiming the queue's jobs.").add_argument("queue")
        sub.add_parser("resume", help="Let workers claim the queue's jobs again.").add_argument("queue")
        conc = sub.add_parser("concurrency", help="At most N of the queue's jobs on each worker at once.")
        conc.add_argument("queue")
        conc.add_argument("n", help="a whole number >= 1, or 'none' to clear the override")
        sub.add_parser("list", help="Every queue's state.").add_argument(
            "--json", action="store_true", help="Print JSON instead of a table."
        )

    def handle(self, *args, **options):
        action = options["action"]
        if action == "list":
            return self.list(options["json"])
        queue = options["queue"]
        try:
            queues.check_queue_name(queue)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if queue not in configured_queues():
            self.stderr.write(
                f"note: {printable(queue)!r} is not in any TASKS backend's QUEUES "
                f"({', '.join(map(printable, configured_queues()))}); the control is stored anyway."
            )
        by = operator()
        if action in ("pause", "resume"):
            changed = (queues.pause if action == "pause" else queues.resume)(queue, by=by)
            state = "paused" if action == "pause" else "resumed"
            self.stdout.write(f"queue {printable(queue)} {state}" + ("" if changed else " (it already was)"))
            return
        raw = options["n"]
        n = (
            None
            if str(raw).strip().lower() in ("none", "off", "clear")
            else whole_number("n", raw, 1, 1_000_000, "none")
        )
        queues.set_concurrency(queue, n, by=by)
        if n is None:
            self.stdout.write(f"queue {printable(queue)}: concurrency override cleared")
        else:
            self.stdout.write(f"queue {printable(queue)}: at most {n} jobs on each worker at once")

    def list(self, as_json: bool) -> None:
        states = queues.queue_states(configured=configured_queues())
        if as_json:
            self.stdout.write(json.dumps([queue_json(s) for s in states], indent=2))
            return
        for s in states:
            self.stdout.write(queue_line(s))


def queue_json(s: queues.QueueState) -> dict:
    return {
        "queue": s.queue_name,
        "paused": s.paused,
        "concurrency": s.concurrency,
        "updated_at": s.updated_at.isoformat() if s.updated_at else None,
        "updated_by": s.updated_by,
    }


def queue_line(s: queues.QueueState) -> str:
    state = "paused" if s.paused else "running"
    conc = f", at most {s.concurrency} per worker" if s.concurrency is not None else ""
    who = f" (changed by {printable(s.updated_by)} at {s.updated_at:%Y-%m-%d %H:%M:%S})" if s.updated_at else ""
    return f"queue {printable(s.queue_name)}: {state}{conc}{who}"
