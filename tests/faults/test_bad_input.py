"""Fault 9: rows no enqueue would write — each ends FAILED with a clear error,
and the worker stays up and keeps processing the rest."""

import json

import shardq
from tests.faults.harness import figures
from tests.taskapp import tasks
from tests.workers import query, scalar, wait_drained, worker_id_of, worker_stats

HUGE = 3 * 1024 * 1024  # over the default SHARDQ["MAX_PAYLOAD_BYTES"] (1 MiB)

# (task path, args json, kwargs json, what the error must say)
BAD_ROWS = {
    "object_as_args": (
        "tests.taskapp.tasks.add",
        '{"a": 1, "b": 2}',
        "{}",
        'args {"a": 1, "b": 2} is not a JSON array',
    ),
    "string_as_args": ("tests.taskapp.tasks.add", '"1, 2"', "{}", 'args "1, 2" is not a JSON array'),
    "list_as_kwargs": ("tests.taskapp.tasks.add", "[]", "[1, 2]", "kwargs [1, 2] is not a JSON object"),
    "wrong_arity": ("tests.taskapp.tasks.add", "[1]", "{}", "missing 1 required positional argument"),
    "unknown_task": (
        "tests.taskapp.tasks.deleted_function",
        "[]",
        "{}",
        "no worker could resolve the task tests.taskapp.tasks.deleted_function",
    ),
    "unknown_module": ("no_such_app.tasks.job", "[]", "{}", "no worker could resolve the task no_such_app.tasks.job"),
    "not_a_task": (
        "tests.taskapp.tasks.plain_function",
        "[]",
        "{}",
        "no worker could resolve the task tests.taskapp.tasks.plain_function",
    ),
    "huge_payload": ("tests.taskapp.tasks.add", json.dumps([1, "x" * HUGE]), "{}", "over SHARDQ['MAX_PAYLOAD_BYTES']"),
}


def errors_of(job_id: int) -> tuple[str, list]:
    status, errors = query("SELECT status, errors FROM shardq_job WHERE id = %s", [job_id])[0]
    return status, json.loads(errors) if isinstance(errors, str) else errors


def insert_raw(task_path: str, args: str, kwargs: str) -> int:
    return scalar(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, "
        "ordered, status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at) "
        "VALUES (%s, 'default', 'reports', 0, now(), 5, 5, false, 'READY', 0, 0, 0, 1, %s::jsonb, %s::jsonb, "
        "'[]', '[]', now()) RETURNING id",
        [task_path, args, kwargs],
    )


def test_bad_rows_fail_clearly_while_the_worker_keeps_processing_good_jobs(workers):
    # A task path no worker resolves is handed back (a deploy may be under
    # way) until UNKNOWN_TASK_TIMEOUT, then dead-lettered naming it: 1 s here.
    worker = workers.start("--concurrency", "2", env={"SHARDQ_UNKNOWN_TASK_TIMEOUT": "1"})
    worker_id = worker_id_of(worker.pid)
    good_before = shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(100)])
    bad = {name: insert_raw(path, args, kwargs) for name, (path, args, kwargs, _) in BAD_ROWS.items()}
    not_json = tasks.not_json.enqueue()
    good_after = shardq.enqueue_many(tasks.add, [((i, 2), {}) for i in range(100)])
    total = len(good_before) + len(bad) + 1 + len(good_after)

    wait_drained(total, timeout=120)

    assert worker.poll() is None, "the worker died on bad input:\n" + workers.log(worker)[-3000:]
    for name, job_id in bad.items():
        status, errors = errors_of(job_id)
        expected = BAD_ROWS[name][3]
        assert status == "FAILED", f"{name}: {status}"
        assert len(errors) == 1 and expected in errors[0]["traceback"], f"{name}: {errors}"
    status, errors = errors_of(int(not_json.id))
    assert status == "FAILED" and "the return value is not JSON" in errors[0]["traceback"], errors
    for result in (*good_before, *good_after):
        result.refresh()
        assert result.status == "SUCCESSFUL"
        assert result.return_value == result.args[0] + result.args[1]
    # Still processing after the bad rows: one more job goes through.
    late = tasks.add.enqueue(20, 22)
    wait_drained(total + 1, timeout=30)
    late.refresh()
    assert late.return_value == 42
    stats = worker_stats(worker_id)
    figures(
        "bad_input", bad_rows=len(bad) + 1, good_jobs=len(good_before) + len(good_after) + 1, failed=stats.get("failed")
    )
