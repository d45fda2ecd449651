"""The web side through PgBouncer (tests/acceptance/test_pgbouncer.py runs
this as ``python -m tests.pgbouncer_web THREADS PER_THREAD``, with
DATABASE_URL on PgBouncer): enqueues from several threads, some inside
``transaction.atomic()``, then ``get_result`` of each, a cancel, and the
admin's pages, all on Django's default connection. Prints one JSON object:
the ids, what failed, the admin pages' statuses."""

import json
import sys
import threading
import traceback
from datetime import timedelta

import django


def main(threads: int, per_thread: int) -> dict:
    django.setup()
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.db import connections, transaction
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    import shardq
    from tests.taskapp import tasks as t

    ids: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def enqueue_many_times(n: int) -> None:
        mine = []
        try:
            for i in range(per_thread):
                if i % 5 == 0:  # the caller's transaction: the job exists at its commit
                    with transaction.atomic():
                        mine.append(t.keyed.enqueue(n * per_thread + i, note="atomic").id)
                else:
                    mine.append(t.keyed.enqueue(n * per_thread + i).id)
        except Exception:
            errors.append(traceback.format_exc())
        finally:
            connections.close_all()  # this thread's connection
            with lock:
                ids.extend(mine)

    workers = [threading.Thread(target=enqueue_many_times, args=(n,)) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()

    backend = t.keyed.get_backend()
    statuses = {}
    for job_id in ids:
        try:
            statuses[job_id] = backend.get_result(job_id).status
        except Exception:
            errors.append(traceback.format_exc())

    later = t.noop.using(run_after=timezone.now() + timedelta(hours=1))
    to_cancel = [later.enqueue() for _ in range(3)]
    cancelled = shardq.cancel(*to_cancel, reason="through pgbouncer")
    cancelled_status = [backend.get_result(r.id).status for r in to_cancel]

    user = get_user_model().objects.create_superuser("pgbouncer-admin", "a@example.com", "x")
    client = Client()
    client.force_login(user)
    pages = [reverse("admin:index")]
    for model in admin.site._registry:
        if model._meta.app_label == "shardq":
            pages.append(reverse(f"admin:shardq_{model._meta.model_name}_changelist"))
    pages.append(reverse("admin:shardq_job_change", args=[ids[0]]))
    admin_status = {page: client.get(page).status_code for page in pages}
    return {
        "ids": ids,
        "statuses": statuses,
        "cancelled": cancelled,
        "cancelled_status": cancelled_status,
        "admin": admin_status,
        "prepared_statements": backend.prepared_statements,
        "errors": errors,
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
