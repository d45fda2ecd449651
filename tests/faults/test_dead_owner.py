"""A SIGKILLed worker's shards are taken over in about a second, not after
its leases expire (dead-owner detection, docs/reliability.md, "A worker
that dies"): two real ``shardq_worker`` processes under a 30 s lease, one
SIGKILLed under load; the survivor holds every shard within two seconds and
every job finishes (the invariants (a)–(e) of harness.py). With
``DEAD_OWNER_DETECTION`` off the same kill waits for the lease."""

import os
import signal
import time

import shardq
from tests.conftest import wait_until
from tests.faults.harness import check_invariants, figures, wait_all_finished
from tests.taskapp import fault_tasks
from tests.workers import query, scalar, worker_id_of

JOBS = 400
JOB_SECONDS = 0.02


def held_by(worker: str) -> int:
    return scalar(
        "SELECT count(*) FROM shardq_shard WHERE pool = '*' AND owner = %s AND lease_expires > clock_timestamp()",
        [worker],
    )


def kill_one_of_two(workers, env: dict) -> tuple[str, str, float]:
    """Start two workers, enqueue the jobs, SIGKILL the second once both
    hold their share and jobs run; (survivor id, victim id, kill time)."""
    procs = [workers.start("--concurrency", "2", env={"SHARDQ_EXPECTED_WORKERS": "2", **env}) for _ in range(2)]
    ids = [worker_id_of(proc.pid) for proc in procs]
    wait_until(lambda: [held_by(w) for w in ids] == [32, 32], timeout=30, message="both workers holding 32 shards")
    # Both sessions recorded (lease and LISTEN: the listener connects after
    # the first lease round), or neither with detection off.
    detection = env.get("SHARDQ_DEAD_OWNER_DETECTION", "true") == "true"
    wait_until(
        lambda: (
            query(
                "SELECT backend_pid IS NOT NULL, listener_pid IS NOT NULL FROM shardq_worker WHERE id = ANY(%s::uuid[])",
                [ids],
            )
            == [(detection, detection)] * 2
        ),
        timeout=10,
        message="both workers' sessions recorded",
    )
    shardq.enqueue_many(fault_tasks.acked, [((), {"n": i, "sleep": JOB_SECONDS}) for i in range(JOBS)])
    wait_until(lambda: scalar("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'") >= 20, timeout=30)
    killed_at = time.monotonic()
    os.killpg(procs[1].pid, signal.SIGKILL)
    procs[1].wait(timeout=10)
    return ids[0], ids[1], killed_at


def test_a_sigkilled_workers_shards_are_taken_over_in_about_a_second_not_after_its_lease(workers):
    survivor, victim, killed_at = kill_one_of_two(workers, {"SHARDQ_LEASE_TTL": "30", "SHARDQ_HEARTBEAT": "10"})
    wait_until(lambda: held_by(survivor) == 64, timeout=10, interval=0.02, message="the survivor holding 64 shards")
    took = time.monotonic() - killed_at
    wait_all_finished(query, JOBS, timeout=120)
    report = check_invariants(query, expected_jobs=JOBS)
    assert report["statuses"] == {"SUCCESSFUL": JOBS}, report
    events = query("SELECT count(*) FROM shardq_shard_event WHERE worker = %s AND reason = 'takeover'", [survivor])
    figures("dead_owner", takeover_s=took, takeovers=events[0][0], rescued=report["rescued"])
    assert events[0][0] == 32
    assert took < 2.0, f"the takeover took {took:.2f} s (LEASE_TTL 30 s)"
    log = "".join(workers.log(p) for p in workers.procs)
    assert f"worker(s) {victim}: lease and LISTEN sessions gone from the database" in log


def test_with_detection_off_a_sigkilled_workers_shards_wait_for_its_lease(workers):
    ttl = 5.0
    survivor, _, killed_at = kill_one_of_two(
        workers, {"SHARDQ_LEASE_TTL": str(ttl), "SHARDQ_HEARTBEAT": "1", "SHARDQ_DEAD_OWNER_DETECTION": "false"}
    )
    wait_until(lambda: held_by(survivor) == 64, timeout=30, interval=0.05, message="the survivor holding 64 shards")
    took = time.monotonic() - killed_at
    wait_all_finished(query, JOBS, timeout=120)
    assert check_invariants(query, expected_jobs=JOBS)["statuses"] == {"SUCCESSFUL": JOBS}
    figures("dead_owner_off", takeover_s=took, lease_ttl_s=ttl)
    # The victim's last renewal was at most a heartbeat before the kill.
    assert took >= ttl - 1.0 - 0.5, took
