"""Real ``shardq_worker`` processes against real PostgreSQL (issue: the worker):
several workers sharing shards, kills, pauses, signals and the command's
flags. One worker's behaviour in this process: tests/integration/test_worker_behaviour.py."""

import itertools
import os
import signal
import threading
import time
from datetime import datetime

import shardq
from tests.helpers import wait_until
from tests.taskapp import tasks
from tests.workers import (
    query,
    scalar,
    shards_by_owner,
    status_counts,
    wait_drained,
    worker_id_of,
    worker_stats,
)


def ledger_counts_per_job() -> dict[int, int]:
    return dict(query("SELECT job_id, count(*) FROM taskapp_ledger GROUP BY 1"))


# CI size; SHARDQ_FULL_ACCEPTANCE=1 (`make acceptance-full`): 5,000 jobs.
LEDGER_JOBS = 5000 if os.environ.get("SHARDQ_FULL_ACCEPTANCE") == "1" else 2000


def test_two_workers_run_ledger_jobs_once_each_and_split_shards_32_32(workers):
    a = workers.start("--concurrency", "4")
    b = workers.start("--concurrency", "4")
    ids_a, ids_b = worker_id_of(a.pid), worker_id_of(b.pid)
    wait_until(
        lambda: shards_by_owner() == {ids_a: 32, ids_b: 32} or shards_by_owner() == {ids_b: 32, ids_a: 32},
        timeout=30,
        message="shards to split 32/32",
    )
    results = shardq.enqueue_many(tasks.ledger, [((), {"n": i}) for i in range(LEDGER_JOBS)])
    wait_drained(LEDGER_JOBS, timeout=180)
    assert status_counts() == {"SUCCESSFUL": LEDGER_JOBS}
    counts = ledger_counts_per_job()
    assert len(counts) == LEDGER_JOBS and set(counts.values()) == {1}
    assert set(counts) == {int(r.id) for r in results}
    assert shards_by_owner() in ({ids_a: 32, ids_b: 32},)
    done_by = dict(query("SELECT worker_ids->>-1, count(*) FROM shardq_job GROUP BY 1"))
    assert set(done_by) == {ids_a, ids_b}, "both workers ran jobs"


def test_sigkill_one_of_two_workers_the_survivor_takes_all_shards_and_rescues_its_jobs(workers):
    a = workers.start("--concurrency", "4")
    b = workers.start("--concurrency", "4")
    ids_a, ids_b = worker_id_of(a.pid), worker_id_of(b.pid)
    wait_until(lambda: len(shards_by_owner()) == 2 and sum(shards_by_owner().values()) == 64, timeout=30)
    shardq.enqueue_many(tasks.ledger, [((), {"n": i, "sleep": 0.05}) for i in range(600)])
    wait_until(
        lambda: (
            scalar("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING' AND worker_ids->>-1 = %s", [ids_a]) > 0
        ),
        timeout=30,
        message="worker A to run jobs",
    )
    a.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    a.wait(timeout=10)
    wait_until(lambda: shards_by_owner() == {ids_b: 64}, timeout=30, interval=0.05, message="survivor to own 64 shards")
    takeover_seconds = time.monotonic() - killed_at
    ttl, heartbeat = 2.0, 0.4
    assert takeover_seconds <= ttl + heartbeat + 1.0, f"takeover took {takeover_seconds:.2f}s"
    wait_drained(600, timeout=120)
    assert status_counts() == {"SUCCESSFUL": 600}
    stats_b = wait_until(lambda: (s := worker_stats(ids_b)).get("rescued") and s, timeout=10)
    executions = sum(ledger_counts_per_job().values())
    # Every job committed once; the extra executions are exactly the rescued
    # jobs whose killed attempt had already written its ledger row.
    reexecuted = executions - 600
    assert 0 <= reexecuted <= stats_b["rescued"]
    # Rescued: jobs A had claimed but not started went back for free; jobs
    # A had started ran again, each charged one worker loss.
    rescued_jobs = scalar("SELECT count(*) FROM shardq_job WHERE jsonb_array_length(worker_ids) > 1")
    assert rescued_jobs == scalar("SELECT count(*) FROM shardq_job WHERE worker_losses = 1")
    assert rescued_jobs <= stats_b["rescued"]
    assert scalar("SELECT count(*) FROM shardq_job WHERE attempts <> jsonb_array_length(worker_ids)") == 0
    print(f"takeover after SIGKILL: {takeover_seconds:.2f}s (TTL {ttl}s, heartbeat {heartbeat}s)")


def test_a_paused_worker_past_its_ttl_cannot_write_outcomes_and_self_fences(workers):
    a = workers.start("--concurrency", "4")
    ids_a = worker_id_of(a.pid)
    wait_until(lambda: shards_by_owner() == {ids_a: 64}, timeout=30)
    b = workers.start("--concurrency", "4")
    ids_b = worker_id_of(b.pid)
    wait_until(lambda: sum(shards_by_owner().values()) == 64 and len(shards_by_owner()) == 2, timeout=30)
    shardq.enqueue_many(tasks.ledger, [((), {"n": i, "sleep": 0.5}) for i in range(200)])
    # Pause A mid-task: once its first jobs are done its threads are busy
    # (a pause right after its first claim could catch every job claimed but
    # not yet started, and then there is no late completion to refuse).
    wait_until(
        lambda: scalar("SELECT count(*) FROM taskapp_ledger WHERE worker = %s", [ids_a]) >= 4,
        timeout=30,
        message="A to finish its first jobs",
    )
    # ... and pause it just after it started a job (within the last 150 ms of
    # its 500 ms): that job cannot have sent its outcome before the pause, so
    # at least one completion comes late (a pause just as the threads finish
    # together could otherwise catch only jobs whose acks were already out).
    running = wait_until(
        lambda: {
            r[0]
            for r in query(
                "SELECT id FROM shardq_job WHERE status = 'RUNNING' AND worker_ids->>-1 = %s "
                "AND last_attempted_at > clock_timestamp() - interval '150 milliseconds'",
                [ids_a],
            )
        },
        timeout=30,
        interval=0.01,
        message="A to start a job",
    )
    a.send_signal(signal.SIGSTOP)
    paused_running = dict(
        query("SELECT id, fence FROM shardq_job WHERE status = 'RUNNING' AND worker_ids->>-1 = %s", [ids_a])
    )
    assert paused_running, running
    wait_until(lambda: shards_by_owner() == {ids_b: 64}, timeout=30, message="B to take over every shard")
    wait_until(
        lambda: (
            not set(
                r[0]
                for r in query("SELECT id FROM shardq_job WHERE status = 'RUNNING' AND worker_ids->>-1 = %s", [ids_a])
            )
        ),
        timeout=30,
        message="A's jobs to be rescued",
    )
    resumed_at = scalar("SELECT clock_timestamp()")
    a.send_signal(signal.SIGCONT)
    wait_drained(200, timeout=120)
    assert status_counts() == {"SUCCESSFUL": 200}
    # An ack A's completer had already sent when it was stopped may still
    # commit (the server finishes it), before the takeover: such a job keeps
    # A's fence. Every other job RUNNING at the pause was rescued and re-run.
    landed = {
        job_id
        for job_id, fence in paused_running.items()
        if scalar("SELECT fence FROM shardq_job WHERE id = %s", [job_id]) == fence
    }
    paused_running = {job_id: fence for job_id, fence in paused_running.items() if job_id not in landed}
    assert paused_running, landed

    def completions_attempted_after_waking() -> int:
        # The ledger row is the task's last act before its outcome goes out;
        # a job running at the pause sent its outcome only after waking
        # (its ledger row may predate the pause if it was paused in between).
        # Only attempts under the fence A held at the pause: after waking A
        # may legitimately claim a rescued job again under a new lease.
        return scalar(
            "SELECT count(*) FROM taskapp_ledger l JOIN unnest(%s::bigint[], %s::bigint[]) AS p(id, fence) "
            "ON l.job_id = p.id AND l.fence = p.fence WHERE l.worker = %s",
            [list(paused_running), list(paused_running.values()), ids_a],
        )

    stats = wait_until(
        lambda: (
            (s := worker_stats(ids_a)).get("self_fences")
            and s.get("fence_rejections", 0) == completions_attempted_after_waking() > 0
            and s
        ),
        timeout=30,
        message=lambda: (
            f"A to count every rejected completion ({completions_attempted_after_waking()}) and self-fence; stats {worker_stats(ids_a)}"
        ),
    )
    # Nothing A tried to write for the jobs it ran while paused landed: the
    # committed outcome of each is the takeover owner's.
    for job_id, fence_at_pause in paused_running.items():
        assert scalar("SELECT fence FROM shardq_job WHERE id = %s", [job_id]) > fence_at_pause
    assert stats["fence_rejections"] <= len(paused_running)
    # It started nothing on the shards it lost: every ledger row A wrote after
    # waking is one of the jobs already running at the pause, or a job it
    # claimed later under a new lease (a higher claim version).
    late = query(
        "SELECT l.job_id, j.fence FROM taskapp_ledger l JOIN shardq_job j ON j.id = l.job_id "
        "WHERE l.worker = %s AND l.at >= %s",
        [ids_a, resumed_at],
    )
    for job_id, _fence in late:
        assert (
            job_id in paused_running
            or scalar(
                "SELECT count(*) FROM shardq_shard_event e JOIN shardq_job j ON j.shard = e.shard "
                "WHERE j.id = %s AND e.worker = %s AND e.at >= %s",
                [job_id, ids_a, resumed_at],
            )
            > 0
        )


def test_a_third_worker_joining_two_moves_shares_to_22_21_21_without_double_ownership(workers):
    a = workers.start("--concurrency", "2")
    b = workers.start("--concurrency", "2")
    worker_id_of(a.pid), worker_id_of(b.pid)
    wait_until(lambda: sorted(shards_by_owner().values()) == [32, 32], timeout=30)
    # Ownership is sampled from before the third worker starts until the
    # shares settle (the handover now takes milliseconds: sampling only
    # after the start could see nothing but the end state).
    samples = []
    settled = threading.Event()

    def sample():
        from django.db import connections

        try:
            while not settled.is_set():
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT shard, owner FROM shardq_shard WHERE owner IS NOT NULL")
                    samples.append(cursor.fetchall())
        finally:
            connections["default"].close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        c = workers.start("--concurrency", "2")
        worker_id_of(c.pid)
        wait_until(lambda: sorted(shards_by_owner().values()) == [21, 21, 22], timeout=60)
    finally:
        settled.set()
        sampler.join(timeout=10)
    assert sorted(shards_by_owner().values()) == [21, 21, 22], shards_by_owner()
    assert len(samples) > 1
    for rows in samples:
        assert len({shard for shard, _ in rows}) == len(rows) <= 64, rows


def test_a_worker_joining_at_the_default_heartbeat_gets_its_share_in_one_handover(workers):
    # HEARTBEAT 10 s and LEASE_TTL 30 s, as a project has them: the joiner
    # must not wait for heartbeats. The holder gives back every shard above
    # its share at once (one release statement for idle shards), announced,
    # so the joiner claims them at once. One shard a tick, as before, took 32
    # release statements over seconds.
    defaults = {"SHARDQ_HEARTBEAT": "10", "SHARDQ_LEASE_TTL": "30", "SHARDQ_POLL_INTERVAL": "1"}
    a = workers.start("--concurrency", "2", env=defaults)
    first = worker_id_of(a.pid)
    wait_until(lambda: shards_by_owner() == {first: 64}, timeout=30)
    b = workers.start("--concurrency", "2", env=defaults)
    second = worker_id_of(b.pid)
    wait_until(
        lambda: shards_by_owner() == {first: 32, second: 32},
        timeout=10,  # less than one heartbeat
        message="the joiner to hold its share",
    )
    # All 32 releases in one statement (one transaction: one xmin), not one a tick.
    releases = query(
        "SELECT count(*), count(DISTINCT xmin::text) FROM shardq_shard_event WHERE reason = 'release' AND worker = %s",
        [first],
    )
    assert releases == [(32, 1)], releases


def test_sigterm_lets_running_jobs_finish_and_releases_leases(workers):
    a = workers.start("--concurrency", "4", "--grace", "20")
    ids_a = worker_id_of(a.pid)
    wait_until(lambda: shards_by_owner() == {ids_a: 64}, timeout=30)
    shardq.enqueue_many(tasks.ledger, [((), {"n": i, "sleep": 1.0}) for i in range(4)])
    wait_until(lambda: status_counts().get("RUNNING") == 4, timeout=30)
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=30) == 0
    assert status_counts() == {"SUCCESSFUL": 4}
    assert scalar("SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL") == 0
    assert scalar("SELECT count(*) FROM shardq_shard_event WHERE worker = %s AND reason = 'release'", [ids_a]) == 64
    assert scalar("SELECT state FROM shardq_worker WHERE id = %s", [ids_a]) == "STOPPED"
    assert sum(ledger_counts_per_job().values()) == 4


def test_processes_flag_runs_a_supervisor_that_restarts_a_killed_child(workers):
    sup = workers.start("--processes", "2", "--concurrency", "2")
    wait_until(lambda: scalar("SELECT count(*) FROM shardq_worker WHERE state = 'RUNNING'") == 2, timeout=60)
    child_pid = scalar("SELECT pid FROM shardq_worker WHERE state = 'RUNNING' ORDER BY started_at LIMIT 1")
    os.kill(child_pid, signal.SIGKILL)
    wait_until(
        lambda: (
            scalar(
                "SELECT count(*) FROM shardq_worker WHERE state = 'RUNNING' AND pid <> %s "
                "AND heartbeat_at > clock_timestamp() - interval '2 seconds'",
                [child_pid],
            )
            == 2
        ),
        timeout=60,
        message="the supervisor to restart the killed child",
    )
    result = tasks.add.enqueue(20, 22)
    wait_until(lambda: (result.refresh(), result.status)[1] == "SUCCESSFUL", timeout=30)
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=60) == 0


def test_a_worker_that_regains_a_shard_writes_the_result_it_already_has_instead_of_running_again(workers):
    from tests.taskapp import fault_tasks

    a = workers.start("--concurrency", "4")
    ids_a = worker_id_of(a.pid)
    wait_until(lambda: shards_by_owner() == {ids_a: 64}, timeout=30)
    results = shardq.enqueue_many(fault_tasks.acked, [((), {"n": i, "sleep": 2.0}) for i in range(4)])
    wait_until(
        lambda: scalar("SELECT count(*) FROM taskapp_execution") == 4, timeout=30, message="A to start all four jobs"
    )
    a.send_signal(signal.SIGSTOP)
    paused = {r[0] for r in query("SELECT id FROM shardq_job WHERE status = 'RUNNING'")}
    assert paused, "the jobs to be running at the pause"
    # B takes A's expired shards over (rescuing its jobs back to READY), never
    # runs them (it serves another queue), and gives the shards back.
    b = workers.start("--concurrency", "1", "--queues", "emails")
    ids_b = worker_id_of(b.pid)
    wait_until(lambda: shards_by_owner() == {ids_b: 64}, timeout=30, message="B to take over every shard")
    wait_until(lambda: status_counts().get("RUNNING", 0) == 0, timeout=30, message="A's jobs to be rescued")
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0
    # A wakes: its four tasks end, their writes are refused (the fence moved
    # on), it claims the shards and the rescued jobs again, and writes the
    # results it has instead of running the tasks a second time.
    a.send_signal(signal.SIGCONT)
    wait_drained(4, timeout=60)
    assert status_counts() == {"SUCCESSFUL": 4}
    assert [r.refresh() or r.return_value for r in results] == [0, 1, 2, 3]
    assert dict(query("SELECT job_id, count(*) FROM taskapp_execution GROUP BY 1")) == {int(r.id): 1 for r in results}
    # One real start each (the recalled write is not a start), one worker loss
    # each (the rescue of A's interrupted attempts).
    assert {r[0] for r in query("SELECT id FROM shardq_job WHERE attempts = 1 AND worker_losses = 1")} == paused
    # Counters are published at each heartbeat: wait for one after the writes.
    wait_until(
        lambda: (s := worker_stats(ids_a)).get("recalled") == len(paused) == s.get("fence_rejections"),
        timeout=30,
        message=lambda: (
            f"A to count {len(paused)} recalled results and as many refused writes; stats {worker_stats(ids_a)}"
        ),
    )


def test_two_workers_run_each_tick_of_a_periodic_task_once(workers):
    env = {"SHARDQ_TEST_PERIODIC": "1"}
    a = workers.start("--concurrency", "2", env=env)
    b = workers.start("--concurrency", "2", env=env)
    ids = {worker_id_of(a.pid), worker_id_of(b.pid)}
    path = "tests.taskapp.periodic_tasks.every_second"

    def ticks_run() -> int:
        return scalar("SELECT count(*) FROM shardq_job WHERE task_path = %s AND status = 'SUCCESSFUL'", [path])

    wait_until(lambda: ticks_run() >= 5, timeout=60, message=lambda: f"5 ticks to run (now {ticks_run()})")
    # Both schedulers offered every tick; the table kept one job a tick.
    wait_until(
        lambda: all(worker_stats(w).get("ticks", 0) >= 5 for w in ids),
        timeout=30,
        message=lambda: f"both schedulers to offer ticks: {[worker_stats(w) for w in ids]}",
    )
    ticks = [
        key.rsplit(":periodic:", 1)[1].split(":", 1)[1]
        for (key,) in query(
            "SELECT u.key FROM shardq_unique u JOIN shardq_job j ON j.id = u.job_id WHERE j.task_path = %s "
            "ORDER BY u.key",
            [path],
        )
    ]
    jobs = scalar("SELECT count(*) FROM shardq_job WHERE task_path = %s", [path])
    assert jobs == len(ticks) == len(set(ticks)) >= 5
    seconds = [datetime.fromisoformat(t) for t in ticks]
    assert all((later - earlier).total_seconds() == 1 for earlier, later in itertools.pairwise(seconds)), ticks
    assert scalar("SELECT count(*) FROM shardq_job WHERE task_path = %s", [path]) == len(ticks)
    # A schedule's own arguments reach its jobs.
    labelled = query(
        "SELECT args::text, kwargs::text, return_value::text FROM shardq_job "
        "WHERE task_path = 'tests.taskapp.periodic_tasks.labelled' AND status = 'SUCCESSFUL'"
    )
    assert labelled and set(labelled) == {("[2]", '{"label": "even"}', '"even:2"')}
