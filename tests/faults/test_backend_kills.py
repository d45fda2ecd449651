"""Fault 3: pg_terminate_backend on a random worker connection every 500 ms —
leaser, fetcher, completer (mid-ack), listener and the tasks' own connections
(mid-transaction) — and the guarantees (a)–(e) still hold, nothing is left
RUNNING, and both workers stay up."""

import shardq
from tests.faults.harness import BackendKiller, Repeating, check_invariants, figures, size, wait_all_finished
from tests.taskapp import fault_tasks
from tests.workers import query, scalar, worker_id_of

JOBS = size(2000, 10000)  # half with a transactional ledger commit, half acked by the completer
KILL_EVERY = 0.5
JOB_SECONDS = 0.05


def test_killing_worker_connections_every_half_second_loses_and_doubles_nothing(workers, injector):
    procs = [workers.start("--concurrency", "4") for _ in range(2)]
    for proc in procs:
        worker_id_of(proc.pid)
    half = JOBS // 2
    shardq.enqueue_many(fault_tasks.tx_ledger, [((), {"n": i, "sleep": JOB_SECONDS}) for i in range(half)])
    shardq.enqueue_many(fault_tasks.acked, [((), {"n": i, "sleep": JOB_SECONDS}) for i in range(JOBS - half)])

    killer = BackendKiller(injector, pattern="shardq%")
    kills = Repeating(killer, KILL_EVERY, "backend-killer")
    kills.start()
    try:
        wait_all_finished(query, JOBS, timeout=size(240, 900))
    finally:
        kills.stop()

    assert all(proc.poll() is None for proc in procs), "a worker died"
    assert scalar("SELECT count(*) FROM shardq_job WHERE status = 'RUNNING'") == 0
    report = check_invariants(query, expected_jobs=JOBS)
    assert report["statuses"] == {"SUCCESSFUL": JOBS}, report
    acked_values = scalar(
        "SELECT count(*) FROM shardq_job WHERE task_path = %s AND status = 'SUCCESSFUL' AND return_value = kwargs->'n'",
        ["tests.taskapp.fault_tasks.acked"],
    )
    assert acked_values == JOBS - half
    logs = "".join(workers.log(p) for p in procs)
    figures(
        "backend_kills",
        jobs=JOBS,
        kills=sum(killer.killed.values()),
        killed_by_name=killer.killed,
        ack_resends=logs.count("ack failed, sending the same fenced write again"),
        **{
            k: report[k]
            for k in (
                "extra_executions",
                "rescued",
                "retries",
                "fence_rejections",
                "self_fences",
                "double_commits",
                "lost",
            )
        },
    )
    assert sum(killer.killed.values()) >= 10
    assert killer.killed.get("shardq-completer", 0) > 0 or killer.killed.get("shardq-task", 0) > 0
