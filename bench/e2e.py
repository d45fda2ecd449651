"""End-to-end benchmark: shardq against the physical limit, side by side in one run.

``make bench`` (``bench/run.py``) runs ``run(options)``. Every
figure is measured twice in the same run: once by a bare psycopg loop doing
the SQL a worker needs (``bench/limit.py``), once through shardq's public API
and real ``manage.py shardq_worker`` processes. The table shows both and
shardq ÷ limit; ``bench/results/e2e-*.json`` keeps every raw run;
``docs/benchmarks.md`` ("## End to end") keeps the last table and
``docs/drain_vs_processes.png``.

Where it runs: a database of its own (``shardq_bench`` on the server of
``DATABASE_URL``, created and migrated when missing) whose shardq tables it
empties between phases. Worker and enqueue child processes run with the
test settings (they install ``tests.taskapp`` and so know the ``noop`` task
the jobs name) with Django's default logging, as a new project has it (no
``LOGGING`` setting, ``DEBUG`` off: ``tests.isolation.default_logging_settings``);
one drain per round also runs with ``tests.settings``, whose LOGGING puts
``django.tasks`` at WARNING, for comparison.

Every compared figure is measured in alternated rounds (limit, shardq,
limit, shardq, ...), so a shift in the shared machine's load hits both
sides; the table shows medians.
"""

import compileall
import json
import math
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil
import psycopg

from bench import cpu as cputime
from bench import fairshare, limit, limits, priority

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "drain_vs_processes.png"
SECTION = "## End to end"
PRIORITY_SECTION = "## Priority"
PHASES = ("enqueue", "drain", "latency", "rss", "backlog", "priority", "fairshare", "limits")
SHARDS = limit.SHARD_COUNT
# Django's default logging, as a new project has it: the headline mode.
DEFAULT_LOGGING = "tests.isolation.default_logging_settings"
# The test settings' LOGGING: django.tasks at WARNING (the bench's old mode).
QUIET_TASK_LOGGING = "tests.settings"
# One-by-one enqueue runs alternate the limit and shardq this many times a round.
ENQUEUE_CHUNKS = 6


@dataclass
class Options:
    database_url: str
    jobs: int = 20_000  # drained per drain run
    one_by_one: int = 3_000  # jobs per one-by-one enqueue run
    bulk: int = 20_000  # jobs per bulk enqueue run
    rounds: int = 3  # alternated rounds of every compared figure (enqueue, drains)
    backlog: int = 200_000  # READY rows for the claim-cost figure (--full: 1M)
    rss_backlog: int = 100_000
    rate: float = 200.0  # jobs/s for pickup latency
    latency_seconds: float = 10.0
    poll_interval: float = 1.0
    concurrency: int = 4
    phases: tuple = PHASES
    write_docs: bool = True


@dataclass
class Row:
    key: str
    figure: str
    unit: str
    limit: float | None
    shardq: float | None
    target: str = ""
    met: bool | None = None
    higher_is_better: bool = True
    ratio: float | None = field(default=None)

    def __post_init__(self):
        if self.ratio is None and self.limit and self.shardq is not None:
            self.ratio = self.shardq / self.limit


def median(values):
    return statistics.median(values) if values else None


def paired_ratio(shardq: list[float | None], limit: list[float | None]) -> float | None:
    """The median of shardq ÷ limit over runs made side by side (same round,
    same chunk): a shift in the machine's load between rounds cancels out."""
    ratios = [s / lim for s, lim in zip(shardq, limit, strict=True) if s is not None and lim]
    return median(ratios)


class Bench:
    def __init__(self, options: Options, progress=None, task=None):
        self.o = options
        self.url = options.database_url
        self.conn = psycopg.connect(self.url, autocommit=True, application_name="shardq-bench")
        self.progress = progress
        self.task = task
        self.raw: dict = {}
        self.logs = RESULTS / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.mp = multiprocessing.get_context("spawn")
        # The checkout whose shardq the worker processes run (an A/B run
        # points it at another one; see bench/ab_drain.py).
        self.repo = REPO
        self._compiled: set[Path] = set()  # checkouts byte-compiled (byte_compile)
        # The postmaster's pid of a server of the bench's own on this
        # machine: drains then report the whole server's CPU per job too.
        self.postmaster: int | None = None

    # -- plumbing ---------------------------------------------------------------------

    def step(self, what: str, advance: float = 1) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=advance, description=what)

    def say(self, what: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=what)

    def sql(self, query: str, params=None):
        cursor = self.conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []

    def reset(self) -> None:
        """Empty the bench database's shardq tables; every shard unowned."""
        self.sql("TRUNCATE shardq_job, shardq_shard_event")
        self.sql("DELETE FROM shardq_worker")
        self.sql("UPDATE shardq_shard SET owner = NULL, lease_expires = NULL")

    def child_env(self, settings: str = DEFAULT_LOGGING, **extra) -> dict:
        env = dict(os.environ)
        env.pop("SHARDQ_EMBEDDED_STARTED_BY", None)
        env.update(
            DJANGO_SETTINGS_MODULE=settings,
            DATABASE_URL=self.url,
            SHARDQ_LOG_LEVEL="WARNING",
            SHARDQ_POLL_INTERVAL=str(self.o.poll_interval),
            PYTHONUNBUFFERED="1",
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def api(self, *args, env: dict | None = None) -> dict:
        """Run bench/api_child.py (shardq's public API) and return its JSON line."""
        done = subprocess.run(
            [sys.executable, str(REPO / "bench" / "api_child.py"), *map(str, args)],
            cwd=REPO,
            env=self.child_env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode:
            raise RuntimeError(f"api_child {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def start_worker(
        self,
        processes: int,
        env: dict | None = None,
        name: str = "worker",
        concurrency: int | None = None,
        flags: tuple[str, ...] = (),
        settings: str = DEFAULT_LOGGING,
    ) -> subprocess.Popen:
        self.byte_compile(self.repo)
        log = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 (the worker writes it until stop_worker)
        proc = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "shardq_worker",
                "--processes",
                str(processes),
                "--concurrency",
                str(concurrency or self.o.concurrency),
                "--grace",
                "5",
                *flags,
            ],
            cwd=self.repo,
            # This checkout's shardq, whatever the virtualenv's editable install names.
            env=self.child_env(settings, PYTHONPATH=str(self.repo), **(env or {})),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: we can kill the whole tree
        )
        proc.log_path = log.name
        return proc

    def byte_compile(self, checkout: Path) -> None:
        """Byte-compile the modules a worker of ``checkout`` imports, once, as
        ``pip install`` does for an installed package (and Python on a
        project's first run). This machine sets PYTHONDONTWRITEBYTECODE, so
        without it every worker start compiled shardq and the test project
        from source: about 80 ms of its boot (measured), which no deployed
        worker pays."""
        if checkout in self._compiled:
            return
        for directory in ("shardq", "tests"):
            compileall.compile_dir(checkout / directory, quiet=2)
        self._compiled.add(checkout)

    def stop_worker(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def worker_failed(self, proc) -> str | None:
        if proc.poll() is not None:
            return f"the worker exited with {proc.returncode}:\n{Path(proc.log_path).read_text()[-3000:]}"
        return None

    def pending(self) -> bool:
        """Any job READY, CLAIMED or RUNNING (walks the partial indexes, not the
        table). CLAIMED counts: a claimed job is not started until its thread
        begins it, so a drain with none READY or RUNNING may still hold some."""
        return self.sql(
            "SELECT EXISTS (SELECT 1 FROM shardq_job WHERE status = 'READY')"
            " OR EXISTS (SELECT 1 FROM shardq_job WHERE status = 'CLAIMED')"
            " OR EXISTS (SELECT 1 FROM shardq_job WHERE status = 'RUNNING')"
        )[0][0]

    def wait_empty(self, timeout: float, proc=None, sample=None, interval: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        next_check = 0.0
        while True:
            now = time.monotonic()
            if sample:
                sample()
            if now >= next_check:
                if not self.pending():
                    return
                next_check = now + interval
            if proc is not None and (failure := self.worker_failed(proc)):
                raise RuntimeError(failure)
            if now > deadline:
                raise RuntimeError(f"jobs still pending after {timeout:.0f}s")
            time.sleep(0.02 if sample else interval)

    def wait_for(self, predicate, timeout: float, what: str, proc=None) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if proc is not None and (failure := self.worker_failed(proc)):
                raise RuntimeError(failure)
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def shards_held(self) -> int:
        return self.sql(
            "SELECT count(*) FROM shardq_shard WHERE owner IS NOT NULL AND lease_expires > clock_timestamp()"
        )[0][0]

    def finished(self) -> tuple[int, float | None, float | None, float | None]:
        """(jobs SUCCESSFUL, their steady rate: (n-1) / (last finished_at - first),
        first and last finished_at as Unix times)."""
        n, first, last = self.sql(
            "SELECT count(*), extract(epoch FROM min(finished_at))::float8, extract(epoch FROM max(finished_at))::float8"
            " FROM shardq_job WHERE status = 'SUCCESSFUL'"
        )[0]
        span = last - first if n > 1 else None
        return n, ((n - 1) / span if span else None), first, last

    def latency(self) -> dict:
        """Pickup latency (ms): last_attempted_at - enqueued_at, both the database's clock."""
        p50, p99, worst, n = self.sql(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),"
            " max(ms), count(*) FROM (SELECT extract(epoch FROM last_attempted_at - enqueued_at) * 1000 AS ms"
            " FROM shardq_job WHERE status = 'SUCCESSFUL') AS l"
        )[0]
        as_float = lambda v: None if v is None else float(v)  # noqa: E731 - numeric comes back as Decimal
        return {"p50_ms": as_float(p50), "p99_ms": as_float(p99), "max_ms": as_float(worst), "jobs": n}

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(self) -> dict:
        """Enqueue rates, limit and shardq alternated: bulk round by round, one
        by one chunk by chunk (``api_child.py pairs``)."""
        o = self.o
        out: dict[str, list[float]] = {}
        self.reset()
        limit.copy_enqueue(self.url, 200)  # warm up the server's caches
        for _ in range(o.rounds):
            self.reset()
            out.setdefault("limit_copy", []).append(o.bulk / limit.copy_enqueue(self.url, o.bulk))
            self.reset()
            seconds = self.api("enqueue", "bulk", o.bulk, 1)["seconds"]
            out.setdefault("shardq_bulk", []).append(o.bulk / seconds[0])
            self.step("enqueue: bulk")
            for name, mode in [("insert_tx", "atomic"), ("insert_autocommit", "autocommit")]:
                self.reset()
                pairs = self.api("pairs", mode, o.one_by_one, ENQUEUE_CHUNKS)
                size = pairs["jobs_per_chunk"]
                out.setdefault(f"limit_{name}", []).extend(size / t for t in pairs["limit"])
                out.setdefault(f"shardq_{mode}", []).extend(size / t for t in pairs["shardq"])
                self.step(f"enqueue: {mode}")
        self.reset()
        return out

    # -- drains -------------------------------------------------------------------------

    def limit_drain(self, processes: int, fill: int, max_jobs: int | None = None, sample_rss: bool = False) -> dict:
        self.reset()
        limit.fill(self.url, fill)
        go, procs, readies, report = self.mp.Event(), [], [], self.mp.Queue()
        per_process = math.ceil(max_jobs / processes) if max_jobs else None
        for shards in limit.split_shards(processes):
            worker = limit.new_worker_id()
            limit.own_shards(self.url, worker, shards)
            ready = self.mp.Event()
            proc = self.mp.Process(
                target=limit.drain_process, args=(self.url, worker, shards, ready, go, per_process, 256, report)
            )
            proc.start()
            procs.append(proc)
            readies.append(ready)
        for ready, proc in zip(readies, procs, strict=True):
            _wait_ready(ready, proc, "a limit drain process")
        peak = 0
        handles = [psutil.Process(p.pid) for p in procs]
        started = time.perf_counter()
        go.set()
        while any(p.is_alive() for p in procs):
            if sample_rss:
                peak = max(peak, sum(_rss(h) for h in handles))
            time.sleep(0.02)
        wall = time.perf_counter() - started
        samples = [report.get(timeout=60) for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode:
                raise RuntimeError(f"a limit drain process exited with {p.exitcode}")
        n, steady, first, last = self.finished()
        cpu = sum(CpuTrack.spent(track, first, last) for track in samples) if n > 1 else None
        return {
            "jobs": n,
            "wall_s": wall,
            "wall_rate": n / wall,
            "steady_rate": steady,
            "cpu_us_per_job": cpu / (n - 1) * 1e6 if cpu is not None else None,
            "peak_rss_mib": peak / 2**20 if sample_rss else None,
        }

    def shardq_drain(
        self,
        processes: int,
        fill: int,
        window: float | None = None,
        sample_rss: bool = False,
        name: str = "drain",
        flags: tuple[str, ...] = (),
        settings: str = DEFAULT_LOGGING,
    ) -> dict:
        """Start ``shardq_worker --processes N`` on ``fill`` READY jobs; wall time from
        the start of the command until every job is SUCCESSFUL (or for ``window``
        seconds after it registered). The worker's CPU time is sampled as it runs."""
        self.reset()
        limit.fill(self.url, fill)
        self.byte_compile(self.repo)  # once, before the clock starts
        peak = [0]
        client0, server0 = cputime.children_cpu(), self.server_cpu()
        started = time.perf_counter()
        proc = self.start_worker(processes, name=f"{name}-{processes}p", flags=flags, settings=settings)
        root = psutil.Process(proc.pid)
        track = CpuTrack(root)

        def sample():
            track.sample()
            if sample_rss:
                peak[0] = max(peak[0], _tree_rss(root))

        try:
            if window is None:
                self.wait_empty(timeout=max(300.0, fill / 50), proc=proc, sample=sample)
                wall = time.perf_counter() - started
            else:
                self.wait_for(
                    lambda: self.sql("SELECT count(*) FROM shardq_worker")[0][0] >= processes,
                    60,
                    "the worker to register",
                    proc,
                )
                until = time.monotonic() + window
                while time.monotonic() < until:
                    sample()
                    if failure := self.worker_failed(proc):
                        raise RuntimeError(failure)
                    time.sleep(0.05)
                wall = time.perf_counter() - started
        finally:
            track.sample()
            self.stop_worker(proc)
        client, server = cputime.children_cpu() - client0, self.server_cpu()
        n, steady, first, last = self.finished()
        spent = CpuTrack.spent(track.samples, first, last) if n > 1 else None
        return {
            "jobs": n,
            "wall_s": wall,
            "wall_rate": n / wall,
            "steady_rate": steady,
            "cpu_us_per_job": spent / (n - 1) * 1e6 if spent is not None else None,
            "peak_rss_mib": peak[0] / 2**20 if sample_rss else None,
            # The whole run's (boot and shutdown included): the worker
            # processes', and the server's when it is the bench's own.
            "run_cpu_us_per_job": client / n * 1e6 if n else None,
            "server_cpu_us_per_job": (server - server0) / n * 1e6 if n and server is not None else None,
        }

    def server_cpu(self) -> float | None:
        """The server's CPU seconds so far (bench/cpu.py), when it is the bench's own (``postmaster``)."""
        return cputime.cluster_cpu(self.postmaster) if self.postmaster is not None else None

    def drains(self) -> dict:
        """Every drain once a round, alternated: limit, shardq with Django's
        default logging, shardq with django.tasks at WARNING; then 2 processes."""
        out: dict[str, list[dict]] = {}
        jobs = self.o.jobs
        for _ in range(self.o.rounds):
            for key, run in [
                ("limit_1p", lambda: self.limit_drain(1, jobs)),
                ("shardq_1p", lambda: self.shardq_drain(1, jobs)),
                ("shardq_1p_quiet", lambda: self.shardq_drain(1, jobs, name="quiet", settings=QUIET_TASK_LOGGING)),
                ("limit_2p", lambda: self.limit_drain(2, jobs)),
                ("shardq_2p", lambda: self.shardq_drain(2, jobs)),
            ]:
                out.setdefault(key, []).append(run())
                self.step(f"drain: {key}")
        return out

    # -- pickup latency -----------------------------------------------------------------

    def limit_latency(self, listen: bool) -> dict:
        self.reset()
        worker = limit.new_worker_id()
        shards = list(range(SHARDS))
        limit.own_shards(self.url, worker, shards)
        ready, stop = self.mp.Event(), self.mp.Event()
        consumer = self.mp.Process(
            target=limit.consume_process, args=(self.url, worker, shards, listen, self.o.poll_interval, ready, stop)
        )
        consumer.start()
        try:
            _wait_ready(ready, consumer, "the limit consumer")
            enqueuer = self.mp.Process(
                target=limit.steady_enqueue, args=(self.url, self.o.rate, self.o.latency_seconds)
            )
            enqueuer.start()
            enqueuer.join()
            self.wait_empty(timeout=30)
        finally:
            stop.set()
            consumer.join(timeout=30)
        return self.latency()

    def shardq_latency(self, notify: bool) -> dict:
        env = {"SHARDQ_NOTIFY": "1" if notify else "0"}
        self.reset()
        proc = self.start_worker(1, env=env, name=f"latency-notify-{int(notify)}")
        try:
            self.wait_for(lambda: self.shards_held() == SHARDS, 60, "the worker to hold every shard", proc)
            self.api("steady", self.o.rate, self.o.latency_seconds, env=env)
            self.wait_empty(timeout=60, proc=proc)
        finally:
            self.stop_worker(proc)
        return self.latency()

    def latencies(self) -> dict:
        out = {}
        for notify in (True, False):
            mode = "notify" if notify else "poll"
            out[f"limit_{mode}"] = self.limit_latency(listen=notify)
            self.step(f"limit pickup latency, {mode}")
            out[f"shardq_{mode}"] = self.shardq_latency(notify)
            self.step(f"shardq pickup latency, {mode}")
        return out

    # -- memory, backlog ------------------------------------------------------------------

    def rss(self) -> dict:
        out = {"limit": self.limit_drain(1, self.o.rss_backlog, sample_rss=True)}
        self.step("limit drain of the RSS backlog")
        out["shardq"] = self.shardq_drain(1, self.o.rss_backlog, sample_rss=True, name="rss")
        self.step("shardq drain of the RSS backlog")
        return out

    def backlog(self, shardq_steady_20k: float | None) -> dict:
        """Drain rate of the first ``jobs`` jobs out of a ``backlog``-row READY table."""
        o = self.o
        out = {"limit": self.limit_drain(1, o.backlog, max_jobs=o.jobs)}
        self.step(f"limit drain at a {o.backlog:,} backlog")
        window = 2.0 + (o.jobs / shardq_steady_20k if shardq_steady_20k else 10.0)
        out["shardq"] = self.shardq_drain(1, o.backlog, window=window, name="backlog")
        self.step(f"shardq drain at a {o.backlog:,} backlog")
        self.reset()
        return out

    # -- the run ----------------------------------------------------------------------------

    def steps(self) -> float:
        counts = {
            "enqueue": 3 * self.o.rounds,
            "drain": 5 * self.o.rounds,
            "latency": 4,
            "rss": 2,
            "backlog": 2,
            "priority": 2,
            "fairshare": 3,
            "limits": 4 * self.o.rounds,
        }
        return sum(counts[p] for p in self.o.phases)

    def run(self) -> dict:
        raw = self.raw
        if "enqueue" in self.o.phases:
            raw["enqueue"] = self.enqueue()
        if "drain" in self.o.phases:
            raw["drain"] = self.drains()
        if "latency" in self.o.phases:
            raw["latency"] = self.latencies()
        if "rss" in self.o.phases:
            raw["rss"] = self.rss()
        if "backlog" in self.o.phases:
            steady = median([r["steady_rate"] for r in raw.get("drain", {}).get("shardq_1p", []) if r["steady_rate"]])
            raw["backlog"] = self.backlog(steady)
            raw["backlog"]["baseline"] = {
                "limit": median([r["steady_rate"] for r in raw.get("drain", {}).get("limit_1p", [])]),
                "shardq": steady,
            }
        if "priority" in self.o.phases:
            raw["priority"] = priority.run(self)
        if "fairshare" in self.o.phases:
            raw["fairshare"] = fairshare.run(self, self.o.rounds, self.o.jobs, 3 * self.o.jobs)
            self.step("fair share: two workers together, a worker joining", advance=3)
        if "limits" in self.o.phases:
            # Concurrency limits' cost (bench/limits.py; docs/benchmarks.md "Limits").
            raw["limits"] = limits.run(self, self.o.rounds, self.o.jobs)
        self.reset()
        return raw


def _wait_ready(ready, proc, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if not proc.is_alive():
            raise RuntimeError(f"{what} exited with {proc.exitcode} before it was ready (traceback above)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout:.0f}s")


class CpuTrack:
    """A process tree's CPU time (user + system), sampled against the wall
    clock: ``time.time()``, the clock PostgreSQL's ``clock_timestamp()`` reads
    on this host, so the CPU spent between two ``finished_at`` values can be
    read off by interpolation."""

    def __init__(self, root: psutil.Process):
        self.root = root
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> None:
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        self.samples.append((time.time(), total))

    @staticmethod
    def spent(samples: list[tuple[float, float]], start: float, end: float) -> float:
        """CPU seconds spent between the wall-clock times ``start`` and ``end``."""

        def at(when: float) -> float:
            before = None
            for stamp, cpu in samples:
                if stamp >= when:
                    if before is None:
                        return cpu
                    share = (when - before[0]) / max(stamp - before[0], 1e-9)
                    return before[1] + (cpu - before[1]) * share
                before = (stamp, cpu)
            return samples[-1][1] if samples else 0.0

        return at(end) - at(start)


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def _tree_rss(root: psutil.Process) -> int:
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    return sum(_rss(p) for p in processes)


# -- the table ----------------------------------------------------------------------------


def rows_from(raw: dict, o: Options) -> list[Row]:
    rows: list[Row] = []
    d = raw.get("drain")
    if d:

        def m(key, what):
            return median([r[what] for r in d.get(key, []) if r.get(what)])

        def paired(side, base, what):
            return paired_ratio([r.get(what) for r in d.get(side, [])], [r.get(what) for r in d.get(base, [])])

        # The headline: what a new project gets (Django's default logging).
        one = Row(
            "drain_1p",
            f"drain {o.jobs:,} no-op jobs, 1 process, Django's default logging (start → all done)",
            "jobs/s",
            m("limit_1p", "wall_rate"),
            m("shardq_1p", "wall_rate"),
            target="≥ 90% of limit",
            ratio=paired("shardq_1p", "limit_1p", "wall_rate"),
        )
        one.met = one.ratio is not None and one.ratio >= 0.9
        rows.append(one)
        steady = Row(
            "drain_1p_steady",
            "  same, steady state (first → last finished_at)",
            "jobs/s",
            m("limit_1p", "steady_rate"),
            m("shardq_1p", "steady_rate"),
            target="≥ 110% of limit",
            ratio=paired("shardq_1p", "limit_1p", "steady_rate"),
        )
        steady.met = steady.ratio is not None and steady.ratio >= 1.1
        rows.append(steady)
        cpu = Row(
            "drain_1p_cpu",
            "  same, CPU per job in steady state (process CPU ÷ jobs)",
            "µs",
            m("limit_1p", "cpu_us_per_job"),
            m("shardq_1p", "cpu_us_per_job"),
            target="≤ 1.5× limit",
            higher_is_better=False,
            ratio=paired("shardq_1p", "limit_1p", "cpu_us_per_job"),
        )
        cpu.met = cpu.ratio is not None and cpu.ratio <= 1.5
        rows.append(cpu)
        if d.get("shardq_1p_quiet"):
            rows.append(
                Row(
                    "drain_1p_quiet",
                    "  same with django.tasks at WARNING (start → all done)",
                    "jobs/s",
                    m("limit_1p", "wall_rate"),
                    m("shardq_1p_quiet", "wall_rate"),
                    ratio=paired("shardq_1p_quiet", "limit_1p", "wall_rate"),
                )
            )
            rows.append(
                Row(
                    "drain_1p_quiet_steady",
                    "  same with django.tasks at WARNING, steady state",
                    "jobs/s",
                    m("limit_1p", "steady_rate"),
                    m("shardq_1p_quiet", "steady_rate"),
                    ratio=paired("shardq_1p_quiet", "limit_1p", "steady_rate"),
                )
            )
    e = raw.get("enqueue")
    if e:
        for key, figure, lim, sq, need in [
            ("enqueue_tx", "enqueue one by one, one transaction", "limit_insert_tx", "shardq_atomic", 0.8),
            (
                "enqueue_autocommit",
                "enqueue one by one, autocommit",
                "limit_insert_autocommit",
                "shardq_autocommit",
                0.9,
            ),
            ("enqueue_bulk", "bulk enqueue (COPY vs enqueue_many)", "limit_copy", "shardq_bulk", 0.5),
        ]:
            row = Row(
                key,
                figure,
                "jobs/s",
                median(e[lim]),
                median(e[sq]),
                target=f"≥ {need:.0%} of limit",
                ratio=paired_ratio(e[sq], e[lim]),
            )
            row.met = row.ratio is not None and row.ratio >= need
            rows.append(row)
    if d:
        rows.append(
            Row(
                "drain_2p",
                f"drain {o.jobs:,} no-op jobs, 2 processes (start → all done)",
                "jobs/s",
                m("limit_2p", "wall_rate"),
                m("shardq_2p", "wall_rate"),
                ratio=paired("shardq_2p", "limit_2p", "wall_rate"),
            )
        )
        rows.append(
            Row(
                "drain_2p_steady",
                "  same, steady state",
                "jobs/s",
                m("limit_2p", "steady_rate"),
                m("shardq_2p", "steady_rate"),
                ratio=paired("shardq_2p", "limit_2p", "steady_rate"),
            )
        )
        lim_scale = _div(m("limit_2p", "wall_rate"), m("limit_1p", "wall_rate"))
        sq_scale = _div(m("shardq_2p", "wall_rate"), m("shardq_1p", "wall_rate"))
        scale = Row("drain_scaling", "drain 2 processes ÷ 1 process", "×", lim_scale, sq_scale, target="shardq ≥ 1.6×")
        scale.met = sq_scale is not None and sq_scale >= 1.6
        rows.append(scale)
    lat = raw.get("latency")
    if lat:
        poll_ms = o.poll_interval * 1000
        for mode, label, bound in [("notify", "NOTIFY on", 10.0), ("poll", "poll only", poll_ms + 10)]:
            for q in ("p50", "p99", "max"):
                row = Row(
                    f"latency_{mode}_{q}",
                    f"pickup latency at {o.rate:.0f} jobs/s, {label}: {q}",
                    "ms",
                    lat[f"limit_{mode}"][f"{q}_ms"],
                    lat[f"shardq_{mode}"][f"{q}_ms"],
                    higher_is_better=False,
                )
                if q == "p99":
                    row.target = f"≤ {bound:.0f} ms"
                    row.met = row.shardq is not None and row.shardq <= bound
                rows.append(row)
    r = raw.get("rss")
    if r:
        row = Row(
            "rss",
            f"peak RSS draining a {o.rss_backlog:,} backlog, 1 process",
            "MiB",
            r["limit"]["peak_rss_mib"],
            r["shardq"]["peak_rss_mib"],
            target="≤ 80 MiB",
            higher_is_better=False,
        )
        row.met = row.shardq is not None and row.shardq <= 80
        rows.append(row)
    b = raw.get("backlog")
    if b:
        rows.append(
            Row(
                "backlog_rate",
                f"drain rate, 1 process, {o.backlog:,} READY rows (steady)",
                "jobs/s",
                b["limit"]["steady_rate"],
                b["shardq"]["steady_rate"],
            )
        )
        lim = _div(b["limit"]["steady_rate"], b["baseline"]["limit"])
        sq = _div(b["shardq"]["steady_rate"], b["baseline"]["shardq"])
        row = Row(
            "backlog_ratio", f"  rate at {o.backlog:,} ÷ rate at {o.jobs:,}", "×", lim, sq, target="shardq ≥ 0.8×"
        )
        row.met = sq is not None and sq >= 0.8
        rows.append(row)
    return rows


def fairshare_rows(raw: dict, o: Options) -> list[Row]:
    """Two worker commands started together, and a worker joining a busy one
    (bench/fairshare.py; default HEARTBEAT and LEASE_TTL)."""
    f = raw.get("fairshare")
    if not f:
        return []
    s = f["summary"]
    rows = [
        Row(
            "together_ratio",
            f"2 worker commands started together ÷ 1 worker, {o.jobs:,}-job drain",
            "×",
            None,
            s["two_over_one"],
            target="≥ 1.5×",
            met=s["two_over_one"] >= 1.5,
        ),
        Row(
            "together_share",
            "  the larger worker's share of that drain",
            "%",
            None,
            100 * s["larger_share"],
            target="≤ 55 %",
            met=s["larger_share"] <= 0.55,
        ),
        Row(
            "join_seconds",
            "a worker joining a busy one: registered → holds its fair share",
            "s",
            None,
            s["seconds_to_fair_share"],
            target="≤ 1 s",
            met=s["seconds_to_fair_share"] <= 1.0,
        ),
        Row(
            "join_unowned",
            "  longest a shard had no live owner during the join",
            "ms",
            None,
            1000 * s["longest_unowned_s"],
            target="≤ 100 ms",
            met=s["longest_unowned_s"] <= 0.1,
        ),
        Row(
            "join_twice",
            "  jobs not run exactly once",
            "jobs",
            None,
            s["jobs_not_run_exactly_once"],
            target="0",
            met=s["jobs_not_run_exactly_once"] == 0,
        ),
    ]
    return rows


def limits_rows(raw: dict) -> list[Row]:
    """Concurrency limits against no limit (bench/limits.py): the limit
    column is the unlimited drain, the shardq column the limited one."""
    lim = raw.get("limits")
    if not lim:
        return []
    rows = []
    for key, figure, floor in (
        ("generous", "no-op drain, max_concurrency=1000 vs none (1 worker)", 0.8),
        ("river", "10 ms tasks, max_concurrency=40 over 4 workers vs none", 0.9),
        ("by_key", "no-op drain, max_concurrency=2 per shard key (1,000 keys) vs none", 0.8),
    ):
        r = lim.get(key)
        if r is None:  # a results file from before the case existed
            continue
        rows.append(
            Row(
                f"limits_{key}",
                figure,
                "jobs/s",
                r["unlimited_rate"],
                r["limited_rate"],
                target=f">= {floor}x",
                met=r["ratio"] >= floor,
                ratio=r["ratio"],
            )
        )
    return rows


def priority_rows(raw: dict) -> list[Row]:
    """The priority phase's table: shardq only (a bare loop has no priorities to keep)."""
    p = raw.get("priority")
    if not p:
        return []
    pick, rows = p["pickup"], []
    for q in ("p50", "p99", "max"):
        row = Row(
            f"priority_pickup_{q}",
            f"priority-100 pickup behind {pick['backlog']:,} READY priority-0 jobs: {q}",
            "ms",
            None,
            pick[f"{q}_ms"],
            higher_is_better=False,
        )
        if q == "p99":
            row.target, row.met = "≤ 50 ms", pick["p99_ms"] is not None and pick["p99_ms"] <= 50
        rows.append(row)
    for key, what in (("order", "a few levels"), ("order_201_levels", "all 201 levels")):
        o = p[key]
        row = Row(
            f"priority_{key}_rises",
            f"mixed drain ({o['jobs']:,} jobs, {what}), 1 thread: runs after a lower priority, after the first fill",
            "count",
            None,
            o["rises_after_first_fill"],
            target="0",
            higher_is_better=False,
        )
        row.met = o["rises_after_first_fill"] == 0
        rows.append(row)
        rows.append(Row(f"priority_{key}_rate", "  same, drain rate", "jobs/s", None, o["rate"]))
    return rows


def priority_section(rows: list[Row], raw: dict, info: dict, o: Options, when: str) -> str:
    p = raw["priority"]["pickup"]
    return "\n".join(
        [
            PRIORITY_SECTION,
            "",
            "Written by `make bench` (`bench/priority.py`, the `priority` phase), in the same run as the table "
            "above. **Pickup**: one `shardq_worker` (`--concurrency "
            f"{o.concurrency}`, default prefetch) drains READY priority-0 no-op jobs; every 50 ms a separate "
            f"process tops the READY backlog up to {p['backlog']:,} jobs and enqueues one priority-100 job "
            "through the public API (`stamp.using(priority=100).enqueue()`), "
            f"{p['samples']} times. Pickup is the moment the task ran (it returns `time.time()`) minus its "
            "`enqueued_at` (the database's clock on the same host), so it includes the jobs the worker had "
            "already started ahead of it. **Order**: one worker with `--concurrency 1` drains 5,000 `stamp` jobs "
            "of mixed priorities spread over the 64 shards; their stamps give the order they ran in; counted are "
            "the times a job ran right after one of lower priority, after the first buffer fill (1 + 512 jobs). "
            "The drain rate shows what claiming level by level costs when every one of Django's 201 priorities "
            f"is present. Machine as above; run: {when}.",
            "",
            markdown_table(rows),
            "",
        ]
    )


def _div(a, b):
    return a / b if a is not None and b else None


def fmt(value, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "jobs/s":
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:,.1f}"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "MiB":
        return f"{value:,.0f}"
    if unit == "µs":
        return f"{value:,.1f}"
    return f"{value:.2f}"


def met_mark(row: Row) -> str:
    return "" if row.met is None else ("met" if row.met else "MISSED")


def rich_table(rows: list[Row], title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name, justify in [
        ("figure", "left"),
        ("unit", "left"),
        ("limit", "right"),
        ("shardq", "right"),
        ("shardq ÷ limit", "right"),
        ("target", "left"),
        ("", "left"),
    ]:
        table.add_column(name, justify=justify)
    for row in rows:
        mark = met_mark(row)
        style = {"met": "green", "MISSED": "bold red"}.get(mark, "")
        table.add_row(
            row.figure,
            row.unit,
            fmt(row.limit, row.unit),
            fmt(row.shardq, row.unit),
            fmt(row.ratio, "×"),
            row.target,
            f"[{style}]{mark}[/]" if style else mark,
        )
    return table


def markdown_table(rows: list[Row]) -> str:
    lines = ["| figure | unit | limit | shardq | shardq ÷ limit | target | |", "|---|---|---:|---:|---:|---|---|"]
    for row in rows:
        mark = met_mark(row)
        lines.append(
            f"| {row.figure.strip()} | {row.unit} | {fmt(row.limit, row.unit)} | {fmt(row.shardq, row.unit)}"
            f" | {fmt(row.ratio, '×')} | {row.target} | {'**MISSED**' if mark == 'MISSED' else mark} |"
        )
    return "\n".join(lines)


# -- the database ----------------------------------------------------------------------


def bench_database(name: str = "shardq_bench", alias: str = "default") -> str:
    """URL of the bench's own database on the server of Django's ``alias``:
    created when missing, then migrated with tests.settings (which installs
    tests.taskapp, the app of the ``noop`` task)."""
    from urllib.parse import quote

    from django.db import connections

    from shardq.db.store import connection_kwargs

    s = connections[alias].settings_dict
    # tests.settings' engine is tests.pgtest, PostgreSQL's own with a faster flush.
    if connections[alias].vendor != "postgresql":
        raise RuntimeError(f"the bench needs PostgreSQL; DATABASES[{alias!r}] is {s['ENGINE']}")
    if s["NAME"] != name:
        with psycopg.connect(**connection_kwargs(alias), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    user = quote(s.get("USER") or "", safe="")
    password = f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or s.get("OPTIONS", {}).get("host", "")
    if host.startswith("/"):
        url = f"postgres://{user}{password}@/{name}?host={quote(host)}"
    else:
        port = f":{s['PORT']}" if s.get("PORT") else ""
        url = f"postgres://{user}{password}@{host}{port}/{name}"
    migrate(url)
    return url


def migrate(url: str) -> None:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=url)
    env.pop("SHARDQ_EMBEDDED_STARTED_BY", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"migrating the bench database failed:\n{done.stderr[-3000:]}")


# -- machine, outputs ---------------------------------------------------------------------


def machine(url: str) -> dict:
    import django

    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    return {
        "cpus": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "postgresql": server,
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "platform": platform.platform(),
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }


def plot(raw: dict, path: Path, subtitle: str) -> bool:
    d = raw.get("drain")
    if not d:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    procs = [1, 2]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for side, what, label, style in [
        ("limit", "wall_rate", "limit (bare psycopg loop)", "o-"),
        ("shardq", "wall_rate", "shardq_worker, start → all done (default logging)", "s-"),
        ("shardq", "steady_rate", "shardq_worker, steady state", "s--"),
    ]:
        ys = [median([r[what] for r in d[f"{side}_{p}p"] if r[what]]) for p in procs]
        ax.plot(procs, ys, style, label=label)
        for x, y in zip(procs, ys, strict=True):
            if y:
                ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xticks(procs)
    ax.set_xlabel("worker processes")
    ax.set_ylabel("no-op jobs drained per second")
    ax.set_ylim(bottom=0)
    ax.set_title("Drain throughput vs processes\n" + subtitle, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def section(rows: list[Row], info: dict, o: Options, when: str, plotted: bool) -> str:
    m = info
    parts = [
        SECTION,
        "",
        "Written by `make bench` (`bench/run.py`, code in `bench/e2e.py` and `bench/limit.py`); "
        "every number below comes from one run on the machine named here. **limit** is a bare psycopg loop "
        "running the SQL a worker needs (`insert_job`, COPY, `claim_jobs` per shard with SKIP LOCKED, a no-op "
        "call per job, one fenced `complete_jobs` per batch of 256); **shardq** is the same work through the "
        "public API (`task.enqueue()`, `shardq.enqueue_many`) and real `manage.py shardq_worker` processes "
        f"(`--concurrency {o.concurrency}`, the checkout byte-compiled first, as an installed package is) "
        "with **Django's default logging**, as a new project has it (no "
        "`LOGGING` setting, `DEBUG` off: `django.tasks` is enabled at INFO and its handlers drop the records); "
        'the rows "with django.tasks at WARNING" run the same drain with the test settings\' `LOGGING`, '
        f"the bench's mode before. Every compared figure is measured in {o.rounds} alternated rounds "
        "(limit, shardq, limit, shardq, …; `--rounds N`) in this one run; one-by-one enqueue alternates "
        f"{ENQUEUE_CHUNKS} chunks of {o.one_by_one // ENQUEUE_CHUNKS:,} jobs a round. Rates are medians; "
        "**shardq ÷ limit is the median of the ratios of runs made side by side** (same round or chunk), "
        "so a change in the shared machine's load between rounds cancels out. Drains start from "
        f"{o.jobs:,} READY no-op jobs; "
        '"start → all done" includes the worker\'s start-up, "steady state" is '
        "(jobs − 1) ÷ (last `finished_at` − first); CPU per job is the process tree's CPU time (user + "
        "system, sampled every 20 ms; the limit's after every ack) between the first and the last "
        "`finished_at`, ÷ (jobs − 1). Pickup latency is `last_attempted_at − enqueued_at` "
        f"(both the database clock) with a steady {o.rate:.0f} jobs/s for {o.latency_seconds:.0f} s from a "
        f"separate process into an idle worker; poll only means `SHARDQ_NOTIFY=0` with a "
        f"{o.poll_interval:g} s poll interval. The claim-cost row drains the first {o.jobs:,} jobs of a "
        f"{o.backlog:,}-row READY backlog (`--full`: 1M); `tests/integration/test_claim_plan.py` guards the "
        "claim query's plan with EXPLAIN.",
        "",
        f"Machine: {m['cpus']} CPUs, {m['ram_gib']} GiB RAM, PostgreSQL {m['postgresql']} (same host), "
        f"Python {m['python']}, Django {m['django']}, psycopg {m['psycopg']}; {m['platform']}; 1-minute load "
        f"average {m.get('load_average_at_start', '?')} at the start (a shared machine is noisy: fsync-bound "
        f"figures such as autocommit enqueue vary up to 2× between runs; compare the ratios). Run: {when}.",
        "",
        markdown_table(rows),
        "",
    ]
    if plotted:
        parts += [f"![drain throughput vs processes]({PLOT.name})", ""]
    parts += [
        "Run it: `make bench` (about 4 minutes on 2 cores), or `.venv/bin/python bench/run.py --help` "
        "(`--rounds`, `--full`, `--only drain,latency`, `--no-docs`). It uses a database of "
        "its own, `shardq_bench` on the server of `DATABASE_URL` (the embedded server when unset), and "
        "empties its shardq tables between phases. Raw runs: `bench/results/e2e-latest.json`.",
        "",
    ]
    return "\n".join(parts)


def write_section(text: str, path: Path = DOCS, heading: str = SECTION) -> None:
    """Replace (or append) the section under ``heading``; keep every other section."""
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = current.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    if start is None:
        body = current.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        before = "\n".join(lines[:start]).rstrip("\n")
        after = "\n".join(lines[end:])
        body = (before + "\n\n" if before else "") + text + ("\n" + after if after else "")
    path.write_text(body.rstrip("\n") + "\n")


def run(options: Options, console=None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    if not console.is_terminal:
        console = Console(width=150)  # a log or a pipe: do not wrap the table at 80 columns
    info = machine(options.database_url)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    started = time.monotonic()
    with Progress(
        TextColumn("{task.description:<48}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("starting", total=None)
        bench = Bench(options, progress, task)
        progress.update(task, total=bench.steps())
        try:
            raw = bench.run()
        finally:
            try:
                bench.reset()
            finally:
                bench.conn.close()
        progress.update(task, description="done")
    rows = rows_from(raw, options) + fairshare_rows(raw, options) + limits_rows(raw)
    subtitle = f"{info['cpus']} CPUs, PostgreSQL {info['postgresql'].split()[0]}, Python {info['python']}, {when}"
    headline = next((row for row in rows if row.key == "drain_1p"), None)
    if headline is not None and headline.ratio is not None:
        console.print(
            f"[bold]Headline[/]: {headline.figure.strip()}: {fmt(headline.shardq, headline.unit)} jobs/s, "
            f"{headline.ratio:.2f}× the bare-SQL limit ({fmt(headline.limit, headline.unit)}; target "
            f"{headline.target}: {met_mark(headline)})"
        )
    if rows:
        console.print(rich_table(rows, f"shardq vs limit — {subtitle}"))
    prio_rows = priority_rows(raw)
    if prio_rows:
        console.print(rich_table(prio_rows, f"priority — {subtitle}"))
    report = {
        "when": when,
        "seconds": time.monotonic() - started,
        "machine": info,
        "options": {k: v for k, v in asdict(options).items() if k != "database_url"},
        "rows": [asdict(r) for r in rows + prio_rows],
        "raw": raw,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    for name in (f"e2e-{stamp}.json", "e2e-latest.json"):
        (RESULTS / name).write_text(json.dumps(report, indent=2, default=str))
    console.print(f"wrote bench/results/e2e-{stamp}.json ({report['seconds']:.0f} s)")
    if options.write_docs and set(options.phases) == set(PHASES):
        plotted = plot(raw, PLOT, subtitle)
        write_section(section(rows, info, options, when, plotted))
        write_section(priority_section(prio_rows, raw, info, options, when), heading=PRIORITY_SECTION)
        console.print(f"wrote {DOCS.relative_to(REPO)} ({SECTION!r}) and {PLOT.relative_to(REPO)}")
    elif options.write_docs:
        console.print("docs/benchmarks.md not written: only a full run (every phase) updates it")
    return report
