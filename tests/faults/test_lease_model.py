"""Fault 8: a model-based Hypothesis state machine over the lease protocol and
the job state machine, run against real PostgreSQL through the worker's own
SQL (``shardq.db.store.WorkerStore``, fake worker ids) and a reference model.

Rules: claim shards (a takeover when the lease expired), renew, expire,
release, claim jobs, write an outcome (complete, fail, retry) for any claim
ever made — a late message when that claim is no longer current — and an
admin retry of a dead-lettered job. After every step the table must equal the
model, and fence, attempts and status_rank never go backwards; SUCCESSFUL is
absorbing, FAILED is left only by an admin retry.
"""

import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from shardq.db.store import WorkerStore, connect
from shardq.worker.jobs import Outcome
from tests.faults.harness import size

SHARDS = 2  # shard_count passed to claim_shards: only shards 0 and 1 take part
TTL = 30.0  # leases never expire on their own here: the `expire` rule does it
WORKERS = [str(uuid.UUID(int=1)), str(uuid.UUID(int=2))]
JOBS = 4
MAX_ATTEMPTS = 2
MAX_WORKER_LOSSES = 2  # small, so the model reaches dead-lettering by worker loss

ADMIN_RETRY = (  # what the dead-letter queue's retry action does: one more attempt
    "UPDATE shardq_job SET status = 'READY', status_rank = status_rank + 1, max_attempts = attempts + 1, "
    "run_after = clock_timestamp(), finished_at = NULL WHERE id = %s AND status = 'FAILED' RETURNING id"
)


class LeaseProtocol(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.admin = connect(application_name="faults-model")
        self.admin.execute("TRUNCATE shardq_job, shardq_shard_event, shardq_worker")
        self.admin.execute(
            "UPDATE shardq_shard SET owner = NULL, lease_expires = NULL, claim_version = 0, claimed_at = NULL"
        )
        self.stores = {w: WorkerStore(application_name="shardq-model") for w in WORKERS}
        self.shards = {s: {"owner": None, "version": 0, "expired": False} for s in range(SHARDS)}
        self.held = {w: {} for w in WORKERS}
        self.clock = 0  # orders run_after like clock_timestamp() does
        self.jobs = {}
        for i in range(JOBS):
            job_id = self.admin.execute(
                "INSERT INTO shardq_job (task_path, backend, queue_name, priority, run_after, shard, key_hash, ordered, "
                "status, status_rank, fence, attempts, max_attempts, args, kwargs, errors, worker_ids, enqueued_at) "
                "VALUES ('tests.taskapp.tasks.noop', 'default', 'default', 0, clock_timestamp(), %s, %s, false, "
                "'READY', 0, 0, 0, %s, '[]', '{}', '[]', '[]', clock_timestamp()) RETURNING id",
                [i % SHARDS, i, MAX_ATTEMPTS],
            ).fetchone()[0]
            self.jobs[job_id] = {
                "status": "READY",
                "rank": 0,
                "fence": 0,
                "attempts": 0,
                "losses": 0,
                "max_attempts": MAX_ATTEMPTS,
                "shard": i % SHARDS,
                "run_after": self.tick(),
            }
        self.claims: list[dict] = []  # every claim ever returned: (job, fence, rank) messages
        self.seen = {job_id: dict(state) for job_id, state in self.jobs.items()}
        self.seen_versions = {s: 0 for s in range(SHARDS)}
        self.last_version = max(
            self.admin.execute("SELECT last_value FROM shardq_claim_version_seq").fetchone()[0],
            0,
        )
        self.retried_by_admin: set[int] = set()

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def teardown(self):
        for store in self.stores.values():
            store.close()
        self.admin.close()

    # -- leases ----------------------------------------------------------------

    @rule(worker=st.sampled_from(WORKERS), wanted=st.integers(1, SHARDS))
    def claim_shards(self, worker, wanted):
        rows = self.stores[worker].claim_shards(worker, wanted, TTL, SHARDS, MAX_WORKER_LOSSES)
        # Versions come from one sequence: each claim's is new, above every
        # version issued before (to any shard), in shard order within a claim.
        issued = {r["shard"]: r["claim_version"] for r in rows}
        expected = []
        for s in sorted(s for s, sh in self.shards.items() if sh["owner"] is None or sh["expired"])[:wanted]:
            shard = self.shards[s]
            previous = shard["owner"]
            assert s in issued, (s, issued)
            assert issued[s] > self.last_version, (issued[s], self.last_version)
            self.last_version = issued[s]
            shard.update(owner=worker, version=issued[s], expired=False)
            rescued = 0
            for job in self.jobs.values():
                if job["shard"] == s and job["status"] in ("CLAIMED", "RUNNING") and job["fence"] < shard["version"]:
                    # Claimed, never started: back for free. Started: a worker
                    # loss; run again until the losses reach MAX_WORKER_LOSSES.
                    if job["status"] == "RUNNING":
                        dead = job["losses"] + 1 >= MAX_WORKER_LOSSES
                        job["losses"] += 1
                        job["status"] = "FAILED" if dead else "READY"
                    else:
                        job["status"] = "READY"
                    job["rank"] += 1
                    job["fence"] = shard["version"]
                    rescued += 1
            self.held[worker][s] = shard["version"]
            expected.append((s, shard["version"], previous, rescued))
        got = [
            (r["shard"], r["claim_version"], str(r["previous_owner"]) if r["previous_owner"] else None, r["rescued"])
            for r in rows
        ]
        assert got == expected, (got, expected)

    @rule(worker=st.sampled_from(WORKERS))
    def renew(self, worker):
        held = self.held[worker]
        kept = self.stores[worker].renew_leases(worker, held, TTL) if held else set()
        expected = {s for s, v in held.items() if self.shards[s]["owner"] == worker and self.shards[s]["version"] == v}
        assert kept == expected, (kept, expected)
        for s in expected:
            self.shards[s]["expired"] = False
        self.held[worker] = {s: v for s, v in held.items() if s in expected}  # self-fence the rest

    @rule(shard=st.integers(0, SHARDS - 1))
    def expire(self, shard):
        self.admin.execute(
            "UPDATE shardq_shard SET lease_expires = clock_timestamp() - interval '1 second' "
            "WHERE shard = %s AND owner IS NOT NULL",
            [shard],
        )
        if self.shards[shard]["owner"] is not None:
            self.shards[shard]["expired"] = True

    @rule(worker=st.sampled_from(WORKERS), shard=st.integers(0, SHARDS - 1))
    def release(self, worker, shard):
        if shard not in self.held[worker]:
            return
        version = self.held[worker].pop(shard)
        released = self.stores[worker].release_shards(worker, {shard: version})
        model = self.shards[shard]
        expected = {shard} if model["owner"] == worker and model["version"] == version else set()
        if expected:
            model.update(owner=None, expired=False)
        assert released == expected

    # -- jobs --------------------------------------------------------------------

    @rule(worker=st.sampled_from(WORKERS), per_shard=st.integers(1, 2))
    def claim_jobs(self, worker, per_shard):
        shards = sorted(self.held[worker])
        if not shards:
            return
        rows = self.stores[worker].claim_jobs(worker, shards, None, per_shard, 100)
        picked = []
        for s in shards:
            shard = self.shards[s]
            if shard["owner"] != worker or shard["expired"]:
                continue
            ready = sorted(
                (job["run_after"], job_id)
                for job_id, job in self.jobs.items()
                if job["shard"] == s and job["status"] == "READY"
            )
            for _, job_id in ready[:per_shard]:
                job = self.jobs[job_id]
                job.update(status="CLAIMED", rank=job["rank"] + 1, fence=shard["version"])
                picked.append(job_id)
                self.claims.append({"id": job_id, "fence": job["fence"], "rank": job["rank"]})
        got = {row["id"]: (row["fence"], row["status_rank"], row["attempts"]) for row in rows}
        assert set(got) == set(picked), (got, picked)
        for job_id in picked:
            job = self.jobs[job_id]
            assert got[job_id] == (job["fence"], job["rank"], job["attempts"])

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), latest=st.booleans())
    def start(self, data, latest):
        """Start one claim (the start write), the newest or any earlier one."""
        claim = self.claims[-1] if latest else data.draw(st.sampled_from(self.claims))
        worker = WORKERS[0]
        job_ref = type("J", (), {"id": claim["id"], "fence": claim["fence"], "status_rank": claim["rank"]})
        started, refused = self.stores[worker].start_jobs(worker, [job_ref])
        assert refused == []
        job = self.jobs[claim["id"]]
        shard = self.shards[job["shard"]]
        applies = (
            job["status"] == "CLAIMED"
            and job["fence"] == claim["fence"]
            and job["rank"] == claim["rank"]
            and shard["version"] == job["fence"]
        )
        assert set(started) == ({claim["id"]} if applies else set()), (claim, job)
        if applies:
            job.update(status="RUNNING", rank=job["rank"] + 1, attempts=job["attempts"] + 1)
            assert started[claim["id"]]["attempts"] == job["attempts"]
            self.claims.append({"id": claim["id"], "fence": claim["fence"], "rank": job["rank"]})

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), status=st.sampled_from(["SUCCESSFUL", "FAILED", "READY"]), latest=st.booleans())
    def write_outcome(self, data, status, latest):
        """Complete, fail or retry one claim: the newest, or any earlier one (a late message)."""
        claim = self.claims[-1] if latest else data.draw(st.sampled_from(self.claims))
        outcome = Outcome(
            claim["id"],
            claim["fence"],
            claim["rank"] + 1,
            status,
            return_value_json="null",
            error_json=None
            if status == "SUCCESSFUL"
            else Outcome.error("builtins.RuntimeError", "RuntimeError: model\n"),
            delay=0.0,
        )
        written, refused = self.stores[WORKERS[0]].complete_jobs([outcome])
        assert refused == []
        job = self.jobs[claim["id"]]
        applies = job["fence"] <= claim["fence"] and job["rank"] < claim["rank"] + 1
        assert written == ({(claim["id"], claim["rank"] + 1)} if applies else set()), (claim, job, status)
        if applies:
            job.update(status=status, rank=claim["rank"] + 1)
            if status == "READY":
                job["run_after"] = self.tick()

    @rule(data=st.data())
    def admin_retry(self, data):
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        rows = self.admin.execute(ADMIN_RETRY, [job_id]).fetchall()
        job = self.jobs[job_id]
        assert bool(rows) == (job["status"] == "FAILED")
        if rows:
            job.update(status="READY", rank=job["rank"] + 1, max_attempts=job["attempts"] + 1, run_after=self.tick())
            self.retried_by_admin.add(job_id)

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def table_matches_the_model_and_nothing_goes_backwards(self):
        rows = self.admin.execute(
            "SELECT id, status, status_rank, fence, attempts, worker_losses FROM shardq_job"
        ).fetchall()
        for job_id, status, rank, fence, attempts, losses in rows:
            model = self.jobs[job_id]
            assert (status, rank, fence, attempts, losses) == (
                model["status"],
                model["rank"],
                model["fence"],
                model["attempts"],
                model["losses"],
            ), (job_id, model)
            before = self.seen[job_id]
            assert rank >= before["rank"] and fence >= before["fence"] and attempts >= before["attempts"]
            if before["status"] == "SUCCESSFUL":
                assert status == "SUCCESSFUL", "SUCCESSFUL is absorbing"
            if before["status"] == "FAILED" and status != "FAILED":
                assert job_id in self.retried_by_admin, "FAILED is left only by an admin retry"
            self.seen[job_id] = dict(model)
        self.retried_by_admin.clear()
        for s, version in self.admin.execute(
            "SELECT shard, claim_version FROM shardq_shard WHERE shard < %s", [SHARDS]
        ).fetchall():
            assert version == self.shards[s]["version"] >= self.seen_versions[s]
            self.seen_versions[s] = version


def test_the_lease_protocol_matches_its_model_against_real_postgresql(transactional_db):
    from shardq.db.store import ensure_shards

    ensure_shards()
    run_state_machine_as_test(
        LeaseProtocol,
        settings=settings(
            max_examples=size(40, 400),
            stateful_step_count=size(30, 60),
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
