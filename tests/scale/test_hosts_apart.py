"""Issue 17 part 2: hosts apart.

Two ``shardq_worker`` processes, each in a network namespace of its own
(``ip netns`` and a veth pair the test makes), reach a private PostgreSQL
server over their veth link (the server listens on the host ends; the shared
server is never touched). The test then cuts one link (its host end goes
down: packets are dropped silently, as on a partition, not refused):

* the cut-off worker self-fences (logs "self-fenced") before the leases it
  holds expire in the table, with no statement of its own getting through;
* the other worker takes every shard over once those leases expire;
* the link comes back: the cut-off worker rejoins (the shares are 32/32
  again) and nothing it wrote under its old fences lands: every job ends
  SUCCESSFUL once, its ledger row carrying its final fence (the fault
  harness's invariants (a)-(e)).

Reported: the self-fence time after the cut against LEASE_TTL, and the
margin before the leases expired. CI and ``make scale`` run it alike (it
lasts well under a minute).
"""

import re
import secrets
import subprocess
import time
from datetime import datetime
from pathlib import Path

import psycopg

from tests.conftest import wait_until
from tests.faults.harness import ACKED_TASK, LEDGER_TASK, check_invariants, figures, insert_jobs
from tests.scale.postgres import ScalePostgres
from tests.workers import FAST_LEASES, WorkerPool

TTL = float(FAST_LEASES["SHARDQ_LEASE_TTL"])
HEARTBEAT = float(FAST_LEASES["SHARDQ_HEARTBEAT"])
JOBS = 600
JOB_SECONDS = 0.2


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)


class Link:
    """A network namespace joined to the host by a veth pair: the host end
    ``host_ip`` (where PostgreSQL listens), the namespace end ``ns_ip``."""

    def __init__(self, tag: str, index: int, subnet: int):
        self.ns = f"shardq-{tag}-{index}"
        self.host_if, self.ns_if = f"sq{tag}{index}h", f"sq{tag}{index}n"  # at most 15 characters
        self.host_ip, self.ns_ip = f"10.{subnet}.{index}.1", f"10.{subnet}.{index}.2"

    def create(self) -> None:
        ip("netns", "add", self.ns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        ip("link", "set", self.ns_if, "netns", self.ns)
        ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        for command in (
            ("addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if),
            ("link", "set", self.ns_if, "up"),
            ("link", "set", "lo", "up"),
        ):
            ip("netns", "exec", self.ns, "ip", *command)

    def cut(self) -> None:
        ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        ip("link", "set", self.host_if, "up")

    def destroy(self) -> None:
        ip("link", "del", self.host_if, check=False)  # deletes both ends
        ip("netns", "del", self.ns, check=False)


def free_subnet() -> int:
    """A 10.N.0.0/16 no interface or route of this machine uses."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    addresses = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    for n in range(200, 250):
        if f"10.{n}." not in routes and f"10.{n}." not in addresses:
            return n
    raise AssertionError("no free 10.N.0.0/16 for the test's veth links")


LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")


def log_times(path: Path, text: str) -> list[float]:
    """Epoch times of the worker's log lines containing ``text``."""
    out = []
    for line in path.read_text().splitlines():
        m = LOG_LINE.match(line)
        if m and text in m.group(2):
            out.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def test_a_worker_cut_off_by_the_network_self_fences_before_its_leases_expire_and_rejoins(tmp_path):
    tag = secrets.token_hex(2)
    subnet = free_subnet()
    links = [Link(tag, i, subnet) for i in range(2)]
    server: ScalePostgres | None = None
    pool = WorkerPool(tmp_path)
    observer = None
    try:
        for link in links:
            link.create()
        server = ScalePostgres(
            listen=("127.0.0.1", *(link.host_ip for link in links)),
            trust_networks=(f"10.{subnet}.0.0/16",),
        )
        server.prepare()
        observer = psycopg.connect(server.url_for(user="observer"), autocommit=True, application_name="hosts-apart")

        def query(sql, params=None):
            cur = observer.execute(sql, params)
            return cur.fetchall() if cur.description else []

        procs = [
            pool.start(
                "--concurrency",
                "2",
                env={"DATABASE_URL": server.url_for(host=link.host_ip)},
                prefix=("ip", "netns", "exec", link.ns),
            )
            for link in links
        ]
        ids = [
            wait_until(
                lambda p=p: query("SELECT id::text FROM shardq_worker WHERE pid = %s", [p.pid]),
                timeout=30,
                message="the worker to register over its veth link",
            )[0][0]
            for p in procs
        ]
        # Each reaches the server from its namespace's address, not loopback.
        clients = dict(query("SELECT DISTINCT host(client_addr), 1 FROM pg_stat_activity WHERE usename = 'postgres'"))
        assert {link.ns_ip for link in links} <= set(clients), clients

        def owners() -> dict[str, int]:
            return dict(
                query(
                    "SELECT owner::text, count(*) FROM shardq_shard WHERE owner IS NOT NULL"
                    " AND lease_expires > clock_timestamp() GROUP BY 1"
                )
            )

        wait_until(lambda: owners() == {ids[0]: 32, ids[1]: 32}, timeout=30, message=lambda: f"32/32: {owners()}")
        # Half commit their outcome with a ledger row in the task's own
        # transaction, half through the worker's batched, fenced ack.
        for task in (LEDGER_TASK, ACKED_TASK):
            insert_jobs(query, task, JOBS // 2, kwargs_sql=f"jsonb_build_object('n', g, 'sleep', {JOB_SECONDS})")
        wait_until(
            lambda: query("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0] >= 40,
            timeout=60,
            message="progress before the cut",
        )

        cut, kept = links[0], ids[1]
        cut_at = time.time()
        cut.cut()
        # No renewal of the cut-off worker lands after the cut: its leases'
        # expiry, read now, is final.
        (expires_at,) = query(
            "SELECT extract(epoch FROM max(lease_expires))::float8 FROM shardq_shard WHERE owner = %s", [ids[0]]
        )[0]
        running_at_cut = query(
            "SELECT count(*) FROM shardq_job j JOIN shardq_shard s ON s.pool = '*' AND s.shard = j.shard"
            " WHERE j.status = 'RUNNING' AND s.owner = %s",
            [ids[0]],
        )[0][0]
        log_a = Path(procs[0].log_path)
        fenced_at = wait_until(
            lambda: next((t for t in log_times(log_a, "self-fenced") if t >= cut_at), None),
            timeout=TTL * 4 + 10,
            message=lambda: f"the cut-off worker to self-fence; its log ends: {log_a.read_text()[-2000:]}",
        )
        wait_until(lambda: owners() == {kept: 64}, timeout=TTL * 4 + 10, message=lambda: f"a takeover: {owners()}")
        taken_over_at = time.time()
        assert fenced_at < expires_at, (fenced_at - cut_at, expires_at - cut_at)

        cut.restore()
        restored_at = time.time()
        wait_until(
            lambda: owners() == {ids[0]: 32, kept: 32},
            timeout=60,
            message=lambda: f"the cut-off worker to rejoin: {owners()}",
        )
        rejoined_at = time.time()
        wait_until(
            lambda: query("SELECT count(*) FROM shardq_job WHERE finished_at IS NULL")[0][0] == 0,
            timeout=180,
            message="every job to finish",
        )
        assert all(p.poll() is None for p in procs), "a worker died with its link"
        report = check_invariants(query, expected_jobs=JOBS)
        assert report["statuses"] == {"SUCCESSFUL": JOBS}, report
        stats_a = query("SELECT stats FROM shardq_worker WHERE id = %s", [ids[0]])[0][0]
        # What the cut-off worker tried to write under its old fences after
        # the link came back, refused: a ledger task's own commit (the
        # executor logs it) and a batched ack (the completer counts it).
        refused = len(log_times(log_a, "is no longer current")) + stats_a.get("outcomes_refused", 0)
        if running_at_cut:
            assert refused >= 1, (running_at_cut, stats_a)
        figures(
            "hosts_apart",
            ttl_s=TTL,
            heartbeat_s=HEARTBEAT,
            self_fence_after_cut_s=fenced_at - cut_at,
            leases_expired_after_cut_s=expires_at - cut_at,
            fence_margin_s=expires_at - fenced_at,
            takeover_after_cut_s=taken_over_at - cut_at,
            rejoin_after_restore_s=rejoined_at - restored_at,
            running_at_cut=running_at_cut,
            old_fence_writes_refused=refused,
            self_fences=stats_a.get("self_fences", 0),
            **{k: report[k] for k in ("extra_executions", "rescued", "retries") if k in report},
        )
    finally:
        pool.stop_all()
        if observer is not None:
            observer.close()
        if server is not None:
            server.destroy()
        for link in links:
            link.destroy()
