"""Rows as the system writes them, for the admin's browser tests: workers
and leases with the columns of ``register_worker`` / ``heartbeat`` /
``claim_shards``, failed attempts as the worker's claims and acks leave
them (``shardq/db/sql/``). Jobs themselves come from ``enqueue``.
"""

import json
import re
import uuid

from django.contrib.auth.models import Permission

from tests.helpers import leased_shard_factory, sql

PASSWORD = "correct horse battery staple"
VIEW_PERMISSIONS = ["view_job", "view_shard", "view_worker", "view_shardevent", "view_dashboard"]


def make_user(django_user_model, username: str, *, superuser=False, permissions=()):
    if superuser:
        return django_user_model.objects.create_superuser(username, f"{username}@example.com", PASSWORD)
    user = django_user_model.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=True)
    granted = list(Permission.objects.filter(content_type__app_label="shardq", codename__in=list(permissions)))
    missing = set(permissions) - {p.codename for p in granted}
    assert not missing, f"no such shardq permission: {sorted(missing)}"
    user.user_permissions.set(granted)
    return user


def register_worker(
    host: str,
    pid: int,
    *,
    heartbeat_age: float = 0.0,
    state: str = "RUNNING",
    stats: dict | None = None,
    queues=("default",),
) -> str:
    """A worker incarnation whose last heartbeat was ``heartbeat_age`` seconds
    ago by the database clock (``register_worker`` + ``heartbeat``)."""
    worker = str(uuid.uuid4())
    sql(
        "INSERT INTO shardq_worker (id, host, pid, queues, started_at, heartbeat_at, state, stats) "
        "VALUES (%s, %s, %s, %s::jsonb, clock_timestamp() - make_interval(secs => %s + 60), "
        "clock_timestamp() - make_interval(secs => %s), %s, %s::jsonb)",
        [worker, host, pid, json.dumps(list(queues)), heartbeat_age, heartbeat_age, state, json.dumps(stats or {})],
    )
    return worker


def hold_shards(worker: str, shards, *, lease_seconds: float = 30.0) -> None:
    """``worker`` claims ``shards`` as ``claim_shards`` does (a new claim
    version, lease until now + ``lease_seconds``; negative: already expired),
    logging the claim."""
    leased_shard_factory(shards, worker=worker, lease_seconds=lease_seconds, log_event=True)


def traceback_text(message: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/shop/tasks.py", line 12, in ship\n'
        "    raise ValueError(message)\n"
        f"ValueError: {message}\n"
    )


def fail_job(job_id, *, attempts: int | None = None, message: str = "carrier refused the parcel") -> None:
    """Record failed attempts on a READY job as the worker's claims and acks
    do (each attempt: claim rank + 1, ack rank + 1, one error); with
    ``attempts`` = its ``max_attempts`` (the default) it is dead-lettered."""
    worker = register_worker("worker-host", 7000 + int(job_id) % 1000)
    sql(
        "UPDATE shardq_job SET status = 'FAILED', "
        "attempts = COALESCE(%(attempts)s, max_attempts), "
        "status_rank = status_rank + 2 * COALESCE(%(attempts)s, max_attempts), "
        "started_at = clock_timestamp() - interval '2 s', "
        "last_attempted_at = clock_timestamp() - interval '1 s', finished_at = clock_timestamp(), "
        "worker_ids = (SELECT jsonb_agg(%(worker)s::text) FROM generate_series(1, COALESCE(%(attempts)s, max_attempts))), "
        "errors = (SELECT jsonb_agg(jsonb_build_object('exception_class_path', 'builtins.ValueError', "
        "    'traceback', %(traceback)s::text)) FROM generate_series(1, COALESCE(%(attempts)s, max_attempts))) "
        "WHERE id = %(id)s AND status = 'READY'",
        {"id": int(job_id), "attempts": attempts, "worker": worker, "traceback": traceback_text(message)},
    )


def job_row(job_id) -> dict | None:
    rows = sql(
        "SELECT status, attempts, max_attempts, status_rank, errors::text, finished_at, "
        "extract(epoch FROM clock_timestamp() - run_after)::float8 FROM shardq_job WHERE id = %s",
        [int(job_id)],
    )
    if not rows:
        return None
    status, attempts, max_attempts, rank, errors, finished_at, due_ago = rows[0]
    return {
        "status": status,
        "attempts": attempts,
        "max_attempts": max_attempts,
        "status_rank": rank,
        "errors": json.loads(errors),
        "finished_at": finished_at,
        "due_seconds_ago": due_ago,
    }


def shard_of(job_id) -> int:
    return sql("SELECT shard FROM shardq_job WHERE id = %s", [int(job_id)])[0][0]


def changelist_row(page, column: str, value):
    """The changelist row whose link column (``th.field-<column>``) reads ``value``."""
    return page.locator("#result_list tbody tr").filter(
        has=page.locator(f"th.field-{column}", has_text=re.compile(rf"^\s*{re.escape(str(value))}\s*$"))
    )


def csrf_post(page, url: str, form: dict):
    """POST ``form`` from the page's session with its CSRF token, as a forged
    (or scripted) submission would: the server alone decides."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(url, form={**form, "csrfmiddlewaretoken": token}, max_redirects=0)


def an_hour_of_work(task_path: str = "tests.taskapp.admin_tasks.ship") -> None:
    """Jobs as an hour of a busy cluster leaves them, a minute at a time:
    throughput that swells and ebbs, a failure now and then, and between
    minutes 25 and 40 a backlog (jobs waited up to 90 s for their start)
    that drains; plus a few due READY jobs waiting now. Times as the worker
    writes them: run_after (due), last_attempted_at (final start),
    finished_at; g spreads them deterministically."""
    sql(
        """
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash,
            shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs,
            return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at, finished_at)
        SELECT %(task)s, 'default', 'default', 0, t.done - t.ran - t.lat, g %% 64, g, (g %% 500)::text, false,
               CASE WHEN g %% 17 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END, 2, 1, 1, 1,
               jsonb_build_array(g %% 500), '{}', '1', '[]', '[]', t.done - t.ran - t.lat,
               t.done - t.ran, t.done - t.ran, t.done
        FROM generate_series(0, 59) AS k
        CROSS JOIN LATERAL generate_series(
            1, (40 + 25 * sin(k / 5.0) + CASE WHEN k BETWEEN 28 AND 40 THEN 50 ELSE 0 END)::int) AS i
        CROSS JOIN LATERAL (SELECT k * 1000 + i AS g) AS n
        CROSS JOIN LATERAL (SELECT
            LEAST(date_trunc('minute', clock_timestamp()) - make_interval(mins => 59 - k)
                  + make_interval(secs => (g * 7919 %% 60000) / 1000.0), clock_timestamp()) AS done,
            make_interval(secs => 0.02 + (g * 13 %% 100) / 200.0) AS ran,
            make_interval(secs => 0.05 + (g * 31 %% 100) / 100.0 * 0.3
                + CASE WHEN k BETWEEN 25 AND 40 THEN 90 * (1 - abs(k - 33) / 8.0) * (g * 17 %% 100) / 100.0
                       ELSE 0 END) AS lat) AS t
        """,
        {"task": task_path},
    )
    sql(
        """
        INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash,
            shard_key, ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs,
            errors, worker_ids, enqueued_at)
        SELECT %(task)s, 'default', 'default', 0, clock_timestamp() - make_interval(secs => g * 9), g %% 64, g,
               g::text, false, 'READY', 0, 0, 0, 1, jsonb_build_array(g), '{}', '[]', '[]',
               clock_timestamp() - make_interval(secs => g * 9)
        FROM generate_series(1, 15) AS g
        """,
        {"task": task_path},
    )
