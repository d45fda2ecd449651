"""``manage.py shardq_reshard`` against real rows (no workers: tests/faults/test_reshard.py runs it under load)."""

import io
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

import shardq
from shardq.core.hashing import shard_key_hash
from shardq.management.commands.shardq_reshard import RESHARD_LOCK
from tests.conftest import wait_until
from tests.helpers import scalar
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else None


def reshard(*args) -> str:
    out = io.StringIO()
    call_command("shardq_reshard", *args, "--no-progress", stdout=out, stderr=io.StringIO())
    return out.getvalue()


def reshard_in_thread(out: io.StringIO, *args) -> None:
    try:
        call_command("shardq_reshard", *args, "--no-progress", stdout=out, stderr=io.StringIO())
    finally:
        connection.close()


def cluster() -> tuple:
    return sql("SELECT shard_count, version, reshard_from FROM shardq_cluster WHERE id = 1")[0]


def misplaced(count: int) -> int:
    return sql(
        "SELECT count(*) FROM shardq_job WHERE status IN ('READY', 'CLAIMED', 'RUNNING') "
        "AND shard <> key_hash & (%s - 1)",
        [count],
    )[0][0]


def test_reshard_moves_each_ready_job_to_key_hash_masked_by_the_new_count_and_keeps_the_rest():
    shardq.enqueue_many(tasks.keyed, [((n,), {}) for n in range(600)])
    before = dict(sql("SELECT id, shard FROM shardq_job"))
    # A job in flight is never moved: its worker finishes it where it is, and
    # the reshard is not over until it has.
    in_flight = sql("SELECT min(id) FROM shardq_job WHERE shard <> key_hash & 127")[0][0]
    sql("UPDATE shardq_job SET status = 'RUNNING' WHERE id = %s", [in_flight])
    assert cluster() == (64, 1, None)

    out = io.StringIO()
    thread = threading.Thread(target=lambda: reshard_in_thread(out, "--to", "128"))
    thread.start()
    try:
        wait_until(lambda: misplaced(128) == 1, timeout=30, message="the READY jobs to move")
        thread.join(1.0)
        assert thread.is_alive(), "the reshard finished while a job in flight was out of its shard"
        assert cluster()[::2] == (128, 64)
    finally:
        sql("UPDATE shardq_job SET status = 'SUCCESSFUL' WHERE id = %s", [in_flight])
        thread.join(30)
    out = out.getvalue()

    after = dict(sql("SELECT id, shard FROM shardq_job"))
    hashes = dict(sql("SELECT id, key_hash FROM shardq_job"))
    moved = {i for i in before if before[i] != after[i]}
    assert moved and in_flight not in moved
    for job_id, shard in after.items():
        if job_id == in_flight:
            assert shard == before[job_id]
            continue
        assert shard == hashes[job_id] & 127
        assert shard in (before[job_id], before[job_id] + 64)  # its old shard or old + old count
    assert f"{len(moved)} READY jobs moved" in out
    # The switch and the finish each bump the version.
    assert cluster() == (128, 3, None)
    assert sql("SELECT count(*) FROM shardq_shard WHERE pool = '*'")[0][0] == 128


def test_after_a_reshard_every_enqueue_path_places_jobs_with_the_new_count():
    reshard("--to", "256")
    one = tasks.keyed.enqueue(user_id=7)
    many = shardq.enqueue_many(tasks.keyed, [((n,), {}) for n in range(50)])
    unique = tasks.unique_report.enqueue(account_id=3)
    rows = sql(
        "SELECT shard, key_hash FROM shardq_job WHERE id = ANY(%s)",
        [[int(r.id) for r in [one, unique, *many]]],
    )
    assert len(rows) == 52
    assert all(shard == key_hash & 255 for shard, key_hash in rows)
    assert max(shard for shard, _ in rows) >= 64  # the new shards are used
    (shard,) = sql("SELECT shard FROM shardq_job WHERE id = %s", [int(one.id)])[0]
    assert shard == shard_key_hash("7") & 255


def test_dry_run_says_what_would_move_and_changes_nothing():
    shardq.enqueue_many(tasks.keyed, [((n,), {}) for n in range(200)])
    expected = misplaced(128)
    before = sql("SELECT id, shard FROM shardq_job ORDER BY id")

    out = reshard("--to", "128", "--dry-run")

    assert f"{expected} READY jobs move" in out and "Nothing was changed" in out
    assert sql("SELECT id, shard FROM shardq_job ORDER BY id") == before
    assert cluster() == (64, 1, None)
    assert sql("SELECT count(*) FROM shardq_shard")[0][0] == 64


@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("32", "would shrink the cluster from 64 shards"),
        ("64", "already has 64 shards"),
        ("96", "--to 96 is not a power of two"),
        ("0", "--to must be a whole number from 1 to 16384"),
        ("32768", "--to must be a whole number from 1 to 16384"),
        ("many", "--to must be a whole number"),
    ],
)
def test_bad_targets_are_refused_with_a_message_and_change_nothing(to, message):
    with pytest.raises(CommandError, match=message):
        reshard("--to", to)
    assert cluster() == (64, 1, None)


def test_a_second_reshard_is_refused_while_one_runs_and_an_interrupted_one_is_resumed():
    # A reshard whose command is between its switch and its finish: it holds
    # the reshard lock on its own session.
    from shardq.db.store import connect

    holder = connect()
    try:
        holder.execute("SELECT pg_advisory_lock(%(classid)s, %(objid)s)", RESHARD_LOCK)
        sql("UPDATE shardq_cluster SET shard_count = 128, reshard_from = 64, switched_at = clock_timestamp()")
        with pytest.raises(CommandError, match="A reshard from 64 to 128 shards is running"):
            reshard("--to", "256")
        with pytest.raises(CommandError, match="A reshard from 64 to 128 shards is running"):
            reshard("--resume")
    finally:
        holder.close()  # the command died: its lock goes with its session
    # The server ends the closed session (and frees its lock) a moment later.
    wait_until(
        lambda: (
            not scalar(
                # pg_locks is the cluster's: only this database's lock (another
                # test database on the server may hold its own reshard lock).
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s AND granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [RESHARD_LOCK["classid"], RESHARD_LOCK["objid"]],
            )
        ),
        timeout=10,
        message="the dead command's session to release the reshard lock",
    )

    with pytest.raises(CommandError, match=r"was interrupted.*--resume"):
        reshard("--to", "256")
    jobs = shardq.enqueue_many(tasks.keyed, [((n,), {}) for n in range(100)])
    sql("UPDATE shardq_job SET shard = key_hash & 63 WHERE id = ANY(%s)", [[int(r.id) for r in jobs]])
    assert misplaced(128) > 0
    out = reshard("--resume")
    assert "resharded 64 → 128" in out
    assert misplaced(128) == 0
    assert cluster()[::2] == (128, None)
    with pytest.raises(CommandError, match="No reshard is running"):
        reshard("--resume")


def test_the_reshard_waits_for_a_transaction_begun_before_the_switch_and_moves_its_late_jobs():
    """An enqueue whose transaction read the old count commits after the
    switch: the command waits for it, then moves its jobs."""
    from shardq.db.store import connect

    late = connect()
    late.autocommit = False
    # Begun before the switch: this job is placed with the old count of 64.
    late.execute(
        "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered, "
        "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at) "
        "SELECT 'tests.taskapp.tasks.keyed', 'default', 'default', 0, now(), g & 63, g, false, 'READY', 0, 0, 0, "
        "1, '[1]', '{}', '[]', '[]', now() FROM generate_series(0, 255) AS g"
    )
    out = io.StringIO()
    thread = threading.Thread(target=lambda: reshard_in_thread(out, "--to", "128"))
    thread.start()
    try:
        thread.join(1.5)
        assert thread.is_alive(), "the reshard finished while a transaction from before its switch was open"
        assert cluster()[::2] == (128, 64)
        late.commit()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        late.close()
        thread.join(30)
    assert "resharded 64 → 128" in out.getvalue()
    assert misplaced(128) == 0
    assert sql("SELECT count(*) FROM shardq_job WHERE shard >= 64")[0][0] == 128


def test_an_enqueue_inside_an_atomic_block_sees_the_count_of_its_statement():
    with transaction.atomic():
        first = tasks.keyed.enqueue(user_id=1)
    reshard("--to", "128")
    with transaction.atomic():
        second = tasks.keyed.enqueue(user_id=1)
    rows = dict(sql("SELECT id, shard FROM shardq_job"))
    h = shard_key_hash("1")
    # The earlier job was READY: moved with the reshard, both sit in the new shard.
    assert rows[int(first.id)] == rows[int(second.id)] == h & 127


def test_waiting_workflow_children_move_with_the_ready_jobs():
    from shardq import Workflow

    # Children of a parent that has not run: WAITING, so never claimed, but
    # they become READY later in whatever shard they sit in; a reshard must
    # move them too, or a key's jobs would end in two shards after it.
    wf = Workflow(name="reshard-waiting")
    parents = [wf.add(tasks.keyed, n) for n in range(40)]
    for n, parent in enumerate(parents):
        wf.add(tasks.keyed, 1000 + n, after=[parent])
    wf.enqueue()
    waiting_before = sql("SELECT count(*) FROM shardq_job WHERE status = 'WAITING' AND shard <> key_hash & 127")
    assert waiting_before[0][0] > 0  # some children belong to a new shard
    reshard("--to", "128")
    assert sql("SELECT count(*) FROM shardq_job WHERE shard <> key_hash & 127") == [(0,)]
    assert sql("SELECT count(*) FROM shardq_job WHERE status = 'WAITING'") == [(40,)]
