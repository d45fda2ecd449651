"""``manage.py shardq_demo`` (what ``make demo`` runs): a command of the
example project's ``demo`` app, not of shardq — it needs gunicorn, requests
and rich (``pip install -e '.[example]'``).

Starts the example project under gunicorn and a 2-process shardq worker,
drives orders through HTTP (each view enqueues a ``send_receipt`` task in the
order's transaction), waits for the queue to drain and prints who did what.
Then it runs one order through the order workflow (``demo.tasks.order_workflow``:
charge, then pack and receipt side by side, then ship, then close) and prints
when each step started and finished, with the link to its graph in the admin.
Then two tenants share a queue (docs/fairness.md): it presses the page
/tenants/'s "noisy tenant" button (2,000 reports at once), then the quiet
tenant's (20 reports), and prints how long the quiet tenant's waited while
the noisy backlog still waits.
Then a durable backfill (``demo.tasks.backfill_audits``, docs/durable.md)
walks every order in about ten batches, each writing one audit per order with
its cursor in one transaction; the demo ``kill -9``s the worker process
running it mid-walk, and the next owner resumes after the last committed
batch: one audit per order, none twice. A Ctrl-C while it walks stops the
workers by SIGTERM, which hand the backfill back READY at its next batch
(cursor kept, no attempt used); the demo prints where it stopped.
Then it creates (or resets) the superuser ``admin``, prints the admin's URL
and that login, and keeps serving until Ctrl-C or SIGTERM; with
``DEMO_EXIT=1`` in the environment (CI) it stops at once instead. Either way
it stops everything it started, the embedded PostgreSQL included when it
started it.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

DEMO_TASKS = ("example_project.demo.tasks.send_receipt",)
BACKFILL_TASK = "example_project.demo.tasks.backfill_audits"
# The order workflow's steps (send_receipt is one of them too).
WORKFLOW_TASKS = tuple(
    f"example_project.demo.tasks.{name}" for name in ("charge_card", "pack_items", "ship_order", "close_order")
)
# The two tenants' reports (/tenants/).
TENANT_TASKS = ("example_project.demo.tasks.build_report",)


def free_port(preferred: int = 8000) -> int:
    """``preferred`` when it is free (a URL to remember), else any free port."""
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise CommandError("no free TCP port on 127.0.0.1")


class Command(BaseCommand):
    help = "Run the shardq demo: gunicorn + 2 worker processes + HTTP load, then a summary."

    def add_arguments(self, parser):
        parser.add_argument("--orders", type=int, default=3000, help="Orders to POST (default 3000).")
        parser.add_argument("--processes", type=int, default=2, help="Worker processes (default 2).")
        parser.add_argument("--concurrency", type=int, default=4, help="Threads per worker process (default 4).")
        parser.add_argument("--timeout", type=float, default=300, help="Seconds to wait for the queue to drain.")

    def handle(self, *args, **options):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Table

        if options["orders"] < 1 or options["processes"] < 1 or options["concurrency"] < 1:
            raise CommandError("--orders, --processes and --concurrency must be ≥ 1.")
        from shardq import embedded

        console = Console()
        root = Path(settings.BASE_DIR)
        console.rule("[bold]shardq demo")
        console.print(
            f"database: {connection.settings_dict['NAME']} "
            f"({'embedded pgserver, started by this demo' if embedded.started_here() else 'DATABASE_URL'})"
        )
        call_command("migrate", verbosity=0)
        self._clear_previous_run()

        port = free_port()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        log_dir = root / ".demo"
        log_dir.mkdir(exist_ok=True)
        started: list[subprocess.Popen] = []
        backfill = None
        try:
            # Each child writes to its own copy of the log's descriptor.
            with open(log_dir / "gunicorn.log", "w") as log:
                web = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gunicorn",
                        "example_project.wsgi:application",
                        "--workers",
                        "2",
                        "--threads",
                        "4",
                        "--bind",
                        f"127.0.0.1:{port}",
                        "--log-level",
                        "warning",
                    ],
                    cwd=root,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(web)
            self._worker_command = [
                sys.executable,
                "manage.py",
                "shardq_worker",
                "--processes",
                str(options["processes"]),
                "--concurrency",
                str(options["concurrency"]),
            ]
            workers = self._start_workers(root, env, log_dir, "w")
            started.append(workers)
            console.print(
                f"gunicorn on http://127.0.0.1:{port}/ (pid {web.pid}); "
                f"shardq_worker --processes {options['processes']} (pid {workers.pid}); logs in .demo/"
            )
            self._wait_http(port, web)

            n = options["orders"]
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=console) as progress:
                posting = progress.add_task("POST /orders/", total=n)
                t0 = time.monotonic()
                self._post_orders(port, n, lambda: progress.advance(posting))
                post_seconds = time.monotonic() - t0
                draining = progress.add_task("jobs finished", total=n)
                deadline = time.monotonic() + options["timeout"]
                while True:
                    done = self._finished()
                    progress.update(draining, completed=done)
                    if done >= n:
                        break
                    if time.monotonic() > deadline:
                        raise CommandError(
                            f"the queue did not drain in {options['timeout']}s ({done}/{n} done); see .demo/workers.log"
                        )
                    if workers.poll() is not None:
                        raise CommandError("the worker supervisor exited early; see .demo/workers.log")
                    time.sleep(0.1)
                drain_seconds = time.monotonic() - t0
            self._report(console, Table, n, post_seconds, drain_seconds)
            self._run_workflow(console, port, workers)
            self._run_tenants(console, port, workers)
            backfill = self._start_backfill(console)
            # Ctrl-C or SIGTERM while it walks (handlers of the demo's own:
            # a shell may have started it with SIGINT ignored).
            interrupted = threading.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: interrupted.set())
            try:
                self._kill_backfill_owner_and_wait(console, backfill, started, (root, env, log_dir), interrupted)
            except KeyboardInterrupt:
                console.print("Ctrl-C: stopping the workers (SIGTERM)")
            else:
                if os.environ.get("DEMO_EXIT"):
                    console.print("DEMO_EXIT is set: stopping now")
                else:
                    self._serve_admin(console, port, started)
        finally:
            for proc in reversed(started):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in reversed(started):
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            if backfill is not None:
                self._print_backfill_left(console, backfill)
            from shardq import embedded

            if embedded.started_here():  # a server this demo only joined keeps running
                connection.close()
                embedded.stop()
                console.print("stopped the embedded PostgreSQL")
        console.print("[green]demo finished: everything it started is stopped.")

    def _serve_admin(self, console, port: int, started: list[subprocess.Popen]) -> None:
        """Print the admin's URL and a login, then serve until Ctrl-C or SIGTERM."""
        from django.contrib.auth import get_user_model

        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        console.rule("[bold]the admin")
        console.print(f"admin: http://127.0.0.1:{port}/admin/shardq/dashboard/")
        console.print(f"login: admin / {password}")
        console.print(f"two tenants, one queue (the noisy tenant button): http://127.0.0.1:{port}/tenants/")
        console.print("serving the admin, gunicorn and the workers until Ctrl-C (logs in .demo/)")
        while not stop.wait(0.5):
            for proc in started:
                if proc.poll() is not None:
                    raise CommandError(f"pid {proc.pid} exited with {proc.returncode}; see .demo/")
        console.print("stopping")

    def _clear_previous_run(self):
        from example_project.demo.models import Order

        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM shardq_edge WHERE child IN (SELECT id FROM shardq_job WHERE task_path = ANY(%s))",
                [list(WORKFLOW_TASKS)],
            )
            cursor.execute(
                "DELETE FROM shardq_job WHERE task_path = ANY(%s)",
                [list(DEMO_TASKS + WORKFLOW_TASKS + TENANT_TASKS + (BACKFILL_TASK,))],
            )
        Order.objects.all().delete()

    def _wait_http(self, port, web):
        import requests

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if web.poll() is not None:
                raise CommandError("gunicorn exited at start; see .demo/gunicorn.log")
            try:
                requests.get(f"http://127.0.0.1:{port}/jobs/0/", timeout=5)
                return
            except requests.RequestException:
                time.sleep(0.2)
        raise CommandError("gunicorn did not answer within 60s; see .demo/gunicorn.log")

    def _post_orders(self, port, n, advance):
        import requests

        url = f"http://127.0.0.1:{port}/orders/"

        def post_range(start):
            with requests.Session() as session:
                for i in range(start, n, 4):
                    body = {"customer_id": i % 500, "total_cents": 100 + i}
                    response = session.post(
                        url, data=json.dumps(body), timeout=30, headers={"Content-Type": "application/json"}
                    )
                    if response.status_code != 201:
                        raise CommandError(f"POST /orders/ answered {response.status_code}: {response.text[:200]}")
                    advance()

        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(post_range, start) for start in range(4)]:
                future.result()

    def _run_workflow(self, console, port, workers) -> None:
        """One order through the order workflow (docs/workflows.md): charge,
        then pack and mail side by side, then ship, then close; printed step
        by step as the ledger of the jobs shows it."""
        from example_project.demo.models import Order
        from example_project.demo.tasks import order_workflow

        order = Order.objects.create(customer_id=7, total_cents=4200)
        with transaction.atomic():
            results = order_workflow(order).enqueue()
        ids = [int(r.id) for r in results]
        deadline = time.monotonic() + 60
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id, task_path, status, started_at, finished_at FROM shardq_job WHERE id = ANY(%s) ORDER BY id",
                    [ids],
                )
                rows = cursor.fetchall()
            if all(row[2] in ("SUCCESSFUL", "FAILED") for row in rows):
                break
            if time.monotonic() > deadline or workers.poll() is not None:
                raise CommandError(f"the order workflow did not finish: {[(r[1], r[2]) for r in rows]}")
            time.sleep(0.05)
        order.refresh_from_db()
        first = min(row[3] for row in rows)
        console.rule(f"workflow order-{order.pk}")
        for _job_id, path, status, started, finished in sorted(rows, key=lambda r: r[3]):
            console.print(
                f"  {path.rsplit('.', 1)[-1]:<13} {status:<10} started +{(started - first).total_seconds() * 1000:6.0f} ms,"
                f" finished +{(finished - first).total_seconds() * 1000:6.0f} ms"
            )
        console.print(
            f"order {order.pk}: status {order.status!r} (rank {order.status_rank}); each step began after its "
            f"parents finished. Graph: http://127.0.0.1:{port}/admin/shardq/job/{ids[-1]}/workflow/"
        )

    def _run_tenants(self, console, port, workers) -> None:
        """The /tenants/ page's buttons, pressed as a browser would: the noisy
        tenant's 2,000 reports, then the quiet tenant's 20; the quiet ones
        run at once past the noisy backlog (docs/fairness.md)."""
        import requests

        from example_project.demo import views

        base = f"http://127.0.0.1:{port}/tenants/"
        with requests.Session() as browser:
            browser.get(base, timeout=30)
            for button in ("noisy/", "quiet/"):
                answer = browser.post(
                    base + button, data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]}, timeout=60
                )
                if answer.status_code != 200:
                    raise CommandError(f"POST /tenants/{button} answered {answer.status_code}: {answer.text[:200]}")
            deadline = time.monotonic() + 60
            while True:
                figures = {t["tenant"]: t for t in browser.get(base + "?format=json", timeout=30).json()["tenants"]}
                quiet, noisy = figures[views.QUIET], figures[views.NOISY]
                if quiet["waiting"] == 0 and quiet["started"] >= views.QUIET_REPORTS:
                    break
                if time.monotonic() > deadline or workers.poll() is not None:
                    raise CommandError(f"the quiet tenant's reports did not run: {quiet}")
                time.sleep(0.1)
        console.rule("two tenants, one queue")
        console.print(
            f"noisy tenant {views.NOISY}: {views.NOISY_REPORTS} reports enqueued, {noisy['waiting']} still waiting; "
            f"quiet tenant {views.QUIET}: {views.QUIET_REPORTS} reports enqueued after them, all run, pickup "
            f"p50 {quiet['pickup_p50_ms']} ms, p99 {quiet['pickup_p99_ms']} ms (fair by tenant: no wait behind the backlog)"
        )

    def _start_backfill(self, console):
        from example_project.demo.models import Order
        from example_project.demo.tasks import backfill_audits

        orders = Order.objects.count()
        size = max(1, -(-orders // 10))  # about ten batches
        pause = float(os.environ.get("DEMO_BACKFILL_PAUSE", "0.5"))
        backfill = backfill_audits.enqueue(size=size, pause=pause)
        console.rule(f"durable backfill (job {backfill.id})")
        console.print(f"  auditing {orders} orders in batches of {size}, {pause} s a batch")
        return backfill

    def _backfill_state(self, backfill) -> tuple[str, int, int | None, int]:
        """(status, batches committed, total, audits written) of the backfill."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT j.status, coalesce(s.batches, 0), s.total, (SELECT count(*) FROM demo_orderaudit) "
                "FROM shardq_job j LEFT JOIN shardq_job_step s ON s.job_id = j.id AND s.kind = 'iterate' "
                "WHERE j.id = %s",
                [int(backfill.id)],
            )
            return cursor.fetchone()

    def _start_workers(self, root, env, log_dir, mode: str) -> subprocess.Popen:
        with open(log_dir / "workers.log", mode) as log:
            return subprocess.Popen(
                self._worker_command,
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _kill_backfill_owner_and_wait(
        self, console, backfill, started: list[subprocess.Popen], where, interrupted: threading.Event
    ) -> None:
        """``kill -9`` the worker process running the backfill once it has
        committed two batches, then wait for it to finish elsewhere. With
        ``--processes 1`` the killed process is the worker itself (there is
        no supervisor to restart it): the demo starts a new one, as a
        process manager would."""
        from example_project.demo.models import Order

        workers = started[-1]

        kill_at = int(os.environ.get("DEMO_BACKFILL_KILL_AT", "2"))
        deadline = time.monotonic() + 120
        while True:
            status, batches, total, _ = self._backfill_state(backfill)
            if batches >= kill_at or status in ("SUCCESSFUL", "FAILED"):
                break
            if time.monotonic() > deadline or workers.poll() is not None:
                raise CommandError(f"the backfill did not commit {kill_at} batches ({status}, {batches}); see .demo/")
            if interrupted.wait(0.05):
                raise KeyboardInterrupt
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT w.pid FROM shardq_job j JOIN shardq_worker w ON w.id::text = j.worker_ids->>-1 "
                "WHERE j.id = %s AND j.status = 'RUNNING'",
                [int(backfill.id)],
            )
            row = cursor.fetchone()
        if row:
            os.kill(row[0], signal.SIGKILL)
            console.print(
                f"  kill -9 of worker pid {row[0]} after {batches} batches of {total} orders; the shard's next "
                "owner resumes the walk once the dead one's lease ends (LEASE_TTL)"
            )
            if row[0] == workers.pid:
                workers.wait()
                workers = self._start_workers(*where, "a")
                started[-1] = workers
        deadline = time.monotonic() + 180
        while True:
            status, batches, total, audits = self._backfill_state(backfill)
            if status in ("SUCCESSFUL", "FAILED"):
                break
            if time.monotonic() > deadline or workers.poll() is not None:
                raise CommandError(f"the backfill did not finish ({status}, batch {batches}); see .demo/")
            if interrupted.wait(0.1):
                raise KeyboardInterrupt
        orders = Order.objects.count()
        console.print(
            f"  backfill {status}: {batches} batches; {audits} audits for {orders} orders "
            f"(each exactly once: {audits == orders})"
        )

    def _print_backfill_left(self, console, backfill) -> None:
        """After the workers stopped: where an unfinished backfill stands."""
        try:
            status, batches, _total, audits = self._backfill_state(backfill)
        except Exception:  # the database is going away with the demo: nothing to print
            return
        if status not in ("SUCCESSFUL", "FAILED"):
            console.print(
                f"backfill job {backfill.id} left {status} after {batches} batches ({audits} audits "
                "committed, cursor kept): `manage.py shardq_worker` resumes it after its last committed batch"
            )

    def _finished(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM shardq_job WHERE task_path = ANY(%s) AND status IN ('SUCCESSFUL', 'FAILED')",
                [list(DEMO_TASKS)],
            )
            return cursor.fetchone()[0]

    def _report(self, console, Table, n, post_seconds, drain_seconds):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT w.id::text, w.pid, w.state, "
                "(SELECT count(*) FROM shardq_job j WHERE j.task_path = ANY(%s) AND j.status = 'SUCCESSFUL' "
                "   AND j.worker_ids->>-1 = w.id::text), "
                "(SELECT count(*) FROM shardq_shard s WHERE s.owner = w.id AND s.lease_expires > clock_timestamp()), "
                "coalesce((w.stats->>'fence_rejections')::int, 0) "
                "FROM shardq_worker w WHERE w.state = 'RUNNING' "
                "AND w.heartbeat_at > clock_timestamp() - interval '60 seconds' ORDER BY w.started_at",
                [list(DEMO_TASKS)],
            )
            rows = cursor.fetchall()
            cursor.execute(
                "SELECT status, count(*) FROM shardq_job WHERE task_path = ANY(%s) GROUP BY 1", [list(DEMO_TASKS)]
            )
            statuses = dict(cursor.fetchall())
            cursor.execute("SELECT count(*) FROM demo_receipt")
            receipts = cursor.fetchone()[0]
        table = Table(title="who did what")
        for column in ("worker", "pid", "jobs done", "shards owned", "fence rejections"):
            table.add_column(column, justify="right" if column != "worker" else "left")
        for worker_id, pid, _state, done, shards, rejections in rows:
            table.add_row(worker_id[:8], str(pid), str(done), str(shards), str(rejections))
        console.print(table)
        console.print(f"jobs: {statuses}; receipts written: {receipts} (one per order: {receipts == n})")
        console.print(
            f"HTTP: {n} orders in {post_seconds:.1f}s ({n / post_seconds:.0f}/s); "
            f"enqueue → all done in {drain_seconds:.1f}s ({n / drain_seconds:.0f} jobs/s end to end)"
        )
