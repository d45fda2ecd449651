"""``manage.py shardq_prune`` against real rows."""

import io

import pytest
from django.core.management import CommandError, call_command

import shardq
from tests.helpers import sql
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def jobs_in(status: str, finished_hours_ago: float | None, n: int = 1) -> set[int]:
    """``n`` jobs moved to ``status``, finished that many hours ago (None: not finished)."""
    ids = [int(r.id) for r in shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(n)])]
    if finished_hours_ago is None:
        sql("UPDATE shardq_job SET status = %s WHERE id = ANY(%s)", [status, ids])
    else:
        sql(
            "UPDATE shardq_job SET status = %s, "
            "finished_at = clock_timestamp() - make_interval(secs => %s * 3600), "
            "enqueued_at = clock_timestamp() - make_interval(secs => %s * 3600 + 60) WHERE id = ANY(%s)",
            [status, finished_hours_ago, finished_hours_ago, ids],
        )
    return set(ids)


def remaining(ids: set[int]) -> set[int]:
    return {r[0] for r in sql("SELECT id FROM shardq_job WHERE id = ANY(%s)", [list(ids)])}


def prune(*args) -> str:
    out = io.StringIO()
    call_command("shardq_prune", *args, "--no-progress", stdout=out)
    return out.getvalue()


def test_prune_deletes_old_successful_jobs_and_keeps_everything_else():
    old_done = jobs_in("SUCCESSFUL", 48, n=7)
    new_done = jobs_in("SUCCESSFUL", 0.5, n=2)
    old_failed = jobs_in("FAILED", 48, n=2)
    ready = jobs_in("READY", None, n=3)
    running = jobs_in("RUNNING", None, n=2)
    old_done |= jobs_in("SUCCESSFUL", 30)  # after newer ids: the walk goes past them
    # A batch of 3 makes the primary-key walk take several steps.
    out = prune("--older-than", "1d", "--batch", "3")
    assert "deleted 8 jobs (SUCCESSFUL" in out, out
    assert remaining(old_done) == set()
    assert remaining(new_done | old_failed | ready | running) == new_done | old_failed | ready | running


def test_prune_with_failed_deletes_the_old_dead_letter_queue_too():
    old_failed = jobs_in("FAILED", 48, n=3)
    new_failed = jobs_in("FAILED", 1)
    out = prune("--older-than", "2h", "--failed")
    assert "deleted 3 jobs (SUCCESSFUL and FAILED" in out, out
    assert remaining(old_failed | new_failed) == new_failed


def test_a_dry_run_counts_and_deletes_nothing():
    old_done = jobs_in("SUCCESSFUL", 48, n=4)
    sql(
        "INSERT INTO shardq_unique (key, job_id, expires_at) VALUES "
        "('t:a', 1, clock_timestamp() - interval '3 days'), ('t:b', 2, clock_timestamp() + interval '1 hour')"
    )
    out = prune("--older-than", "1d", "--dry-run")
    assert "would delete" in out and "4 jobs (SUCCESSFUL)" in out and "1 expired unique keys" in out, out
    assert remaining(old_done) == old_done
    assert sql("SELECT count(*) FROM shardq_unique")[0][0] == 2


def test_prune_deletes_expired_unique_keys_old_workers_and_history_but_not_owners():
    sql(
        "INSERT INTO shardq_unique (key, job_id, expires_at) VALUES "
        "('t:old', 1, clock_timestamp() - interval '3 days'), ('t:live', 2, clock_timestamp() + interval '1 hour')"
    )
    sql(
        "INSERT INTO shardq_worker (id, host, pid, queues, started_at, heartbeat_at, state, stats) VALUES "
        "('00000000-0000-0000-0000-000000000001', 'h', 1, '[]', now() - interval '9 days', now() - interval '8 days', 'STOPPED', '{}'), "
        "('00000000-0000-0000-0000-000000000002', 'h', 2, '[]', now() - interval '9 days', now() - interval '8 days', 'RUNNING', '{}'), "
        "('00000000-0000-0000-0000-000000000003', 'h', 3, '[]', now(), now(), 'RUNNING', '{}')"
    )
    # Worker 2 is long dead but still named as a shard's owner: kept.
    sql("UPDATE shardq_shard SET owner = '00000000-0000-0000-0000-000000000002' WHERE shard = 5")
    sql(
        "INSERT INTO shardq_shard_event (shard, claim_version, worker, reason, rescued, at) VALUES "
        "(1, 1, '00000000-0000-0000-0000-000000000001', 'claim', 0, now() - interval '8 days'), "
        "(1, 2, '00000000-0000-0000-0000-000000000003', 'claim', 0, now())"
    )
    out = prune("--older-than", "7d")
    assert "1 expired unique keys, 1 worker rows, 1 shard events" in out, out
    assert [r[0] for r in sql("SELECT key FROM shardq_unique")] == ["t:live"]
    assert sorted(r[0] for r in sql("SELECT pid FROM shardq_worker")) == [2, 3]
    assert [r[0] for r in sql("SELECT claim_version FROM shardq_shard_event")] == [2]


@pytest.mark.parametrize("value", ["", "7x", "-1d", "d", "1.5.2h"])
def test_a_bad_older_than_is_refused_with_the_accepted_form(value):
    with pytest.raises(CommandError, match="--older-than must be a number with an optional unit"):
        prune(f"--older-than={value}")


def test_a_bad_batch_is_refused():
    with pytest.raises(CommandError, match="--batch must be a whole number"):
        prune("--batch", "0")


def test_get_result_of_a_pruned_job_raises_does_not_exist_in_the_process_that_read_it():
    # Django: "If the result does not exist, TaskResultDoesNotExist is raised."
    # A SUCCESSFUL result read before the prune must not outlive its row.
    from django.tasks.exceptions import TaskResultDoesNotExist

    [job_id] = jobs_in("SUCCESSFUL", 48)
    assert tasks.add.get_result(str(job_id)).status == "SUCCESSFUL"
    prune("--older-than", "1d")
    assert remaining({job_id}) == set()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(str(job_id))
