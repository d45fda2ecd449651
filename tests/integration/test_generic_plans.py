"""The start and ack connections plan each statement once (``generic_plans``
in shardq/db/sql/session.sql): under plan_cache_mode's default PostgreSQL
planned the start write afresh at every call, which cost the server more CPU
than the write (docs/benchmarks.md). Stepped stages, real PostgreSQL."""

import pytest

import shardq
from shardq.db.store import WorkerStore
from shardq.worker.jobs import STARTED, Outcome
from tests.helpers import job_row
from tests.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def prepared(store: WorkerStore) -> dict[str, tuple[int, int]]:
    """(generic plans, custom plans) of each statement prepared on ``store``'s
    connection, by the first words of its text."""
    assert store.conn is not None
    rows = store.conn.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements").fetchall()
    return {" ".join(text.split())[:40]: (generic, custom) for text, generic, custom in rows}


def test_only_the_start_and_ack_connections_plan_each_statement_once(stepped):
    stores = stepped.worker.store
    assert {name for name, store in stores.items() if store.generic_plans} == {"starter", "completer"}
    assert {name for name, store in stores.items() if store.ordered_walks} == {"fetcher", "outrank"}
    plain = WorkerStore(application_name="shardq-test-plain")
    generic = WorkerStore(application_name="shardq-test-generic", generic_plans=True)
    try:
        assert plain.run("show_plan_cache_mode", {}, fetch="one")[0] == "auto"
        assert generic.run("show_plan_cache_mode", {}, fetch="one")[0] == "force_generic_plan"
        # A reconnection sets it again (a dropped connection is reopened on the next call).
        assert generic.conn is not None
        generic.conn.close()
        assert generic.run("show_plan_cache_mode", {}, fetch="one")[0] == "force_generic_plan"
    finally:
        plain.close()
        generic.close()


def test_the_start_writes_and_the_acks_riding_on_them_are_planned_once_and_still_land(stepped):
    n = 8  # within the stepped worker's buffer (two threads)
    ids = [int(r.id) for r in shardq.enqueue_many(tasks.add, [((i, 1), {}) for i in range(n)])]
    claimed = {job.id: job for job in stepped.claim(n)}
    jobs = [claimed[i] for i in ids]
    starts, completer = stepped.worker.executor.starts, stepped.worker.completer
    # Each start carries the outcome of the job before it (the acks ride).
    for before, job in zip([None, *jobs], jobs, strict=False):
        if before is not None:
            completer.put(
                Outcome(
                    before.id,
                    before.fence,
                    before.status_rank + 1,
                    "SUCCESSFUL",
                    return_value_json="1",
                    shard=before.shard,
                    attempts=1,
                )
            )
        assert starts.start(job) == (STARTED, None)
    stepped.write()
    assert [job_row(i)["status"] for i in ids] == ["SUCCESSFUL"] * (n - 1) + ["RUNNING"]
    plans = prepared(stepped.worker.store["starter"])
    ride = [counts for text, counts in plans.items() if text.startswith("WITH done AS ( UPDATE shardq_job")]
    assert ride and ride[0][1] == 0 and ride[0][0] >= n - 2, plans  # no custom plan: planned once
