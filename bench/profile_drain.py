"""Profile one worker draining no-op jobs, as ``make bench``'s drain runs it.

    DATABASE_URL=... .venv/bin/python bench/profile_drain.py [--jobs 100000] [--gil] [--idle] [--out DIR]

Fills ``--jobs`` READY no-op jobs, starts ``shardq_worker --processes 1
--concurrency 4`` with Django's default logging under ``py-spy record``
(raw collapsed stacks, one line a stack, by thread), waits until every job
is done and stops the worker. Prints the top frames (self and inclusive
shares) of the samples, by thread and overall, and the boot timeline
(process start → registered → first finished → last finished, the
database's clock). ``--gil`` samples only the thread holding the GIL (where
the CPU goes); ``--idle`` keeps waiting threads too (where the wall time
goes). Not part of the shardq package.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def summarize(path: Path, top: int, skip_main: bool = False) -> None:
    """Self and inclusive shares of frames in py-spy's raw output (without
    the main thread's samples: the worker's steady state)."""
    selfs: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        if skip_main and frames[0].endswith("MainThread"):
            continue
        total += n
        thread = frames[0].partition(": ")[2] or frames[0]
        threads[thread] += n
        names = [re.sub(r" \((.*?)/([^/]*\.py):\d+\)", r" (\2)", f) for f in frames[1:]]
        if names:
            selfs[names[-1]] += n
        for name in set(names):
            incl[name] += n
    print(f"{total} samples")
    print("by thread:")
    for name, n in threads.most_common(12):
        print(f"  {n / total:6.1%}  {name}")
    print("self:")
    for name, n in selfs.most_common(top):
        print(f"  {n / total:6.1%}  {name}")
    print("inclusive:")
    for name, n in incl.most_common(top):
        print(f"  {n / total:6.1%}  {name}")


def _ticks(pid: int) -> dict[int, int]:
    """utime + stime (clock ticks) of each thread of ``pid``."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        ticks[int(task.name)] = int(fields[11]) + int(fields[12])
    return ticks


def thread_cpu(bench, pid: int, jobs: int) -> None:
    """Each thread's CPU between 20% and 80% of the jobs done, by name, per job."""

    def done() -> int:
        return bench.sql("SELECT count(*) FROM shardq_job WHERE status = 'SUCCESSFUL'")[0][0]

    while done() < jobs * 0.2:
        time.sleep(0.01)
    n0, t0 = done(), _ticks(pid)
    dump = subprocess.run(
        [str(Path(sys.executable).parent / "py-spy"), "dump", "--nonblocking", "--pid", str(pid)],
        capture_output=True,
        text=True,
    ).stdout
    names = {
        int(tid, 16) if tid.startswith("0x") else int(tid): name
        for tid, name in re.findall(r'Thread (\w+) \((?:idle|active)[^)]*\): "([^"]*)"', dump)
    }
    while done() < jobs * 0.8:
        time.sleep(0.01)
    n1, t1 = done(), _ticks(pid)
    hz = os.sysconf("SC_CLK_TCK")
    per = {}
    for tid, ticks in t1.items():
        name = names.get(tid, f"tid {tid}")
        per[name] = per.get(name, 0) + ticks - t0.get(tid, 0)
    total = sum(per.values())
    print(f"thread CPU over {n1 - n0:,} jobs: {total / hz / (n1 - n0) * 1e6:.1f} µs/job")
    for name, ticks in sorted(per.items(), key=lambda kv: -kv[1]):
        if ticks:
            print(f"  {ticks / total:6.1%}  {ticks / hz / (n1 - n0) * 1e6:5.1f} µs/job  {name}")


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/profile_drain.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--database", default="shardq_bench")
    p.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL")
    p.add_argument("--idle", action="store_true", help="keep idle (waiting) samples")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "profile")
    p.add_argument("--settings", default="tests.isolation.default_logging_settings")
    p.add_argument("--no-spy", action="store_true", help="just the timeline, no profiler")
    p.add_argument(
        "--thread-cpu",
        action="store_true",
        help="no profiler: each worker thread's CPU time (/proc) over the middle of the drain, named by one py-spy dump",
    )
    args = p.parse_args()
    sys.path[:] = [str(REPO), *(q for q in sys.path if Path(q or ".").resolve() != REPO / "bench")]
    os.chdir(REPO)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import e2e, limit

    bench = e2e.Bench(e2e.Options(database_url=e2e.bench_database(args.database), jobs=args.jobs))
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / f"drain{'-gil' if args.gil else ''}{'-idle' if args.idle else ''}.txt"
    bench.reset()
    limit.fill(bench.url, args.jobs)
    if args.thread_cpu:
        args.no_spy = True
    spy = [] if args.no_spy else [
        str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "--threads",
        "--rate", str(args.rate), "-o", str(raw), *(["--gil"] if args.gil else []),
        *(["--idle"] if args.idle else []), "--",
    ]  # fmt: skip
    env = bench.child_env(args.settings, PYTHONPATH=str(REPO))
    bench.byte_compile(REPO)  # as make bench's workers run (e2e.Bench.byte_compile)
    (db_start,) = bench.sql("SELECT clock_timestamp()")[0]
    began = time.perf_counter()
    proc = subprocess.Popen(
        [*spy, sys.executable, "manage.py", "shardq_worker", "--processes", "1", "--concurrency", "4", "--grace", "5"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    import psutil

    try:
        if args.thread_cpu:
            thread_cpu(bench, proc.pid, args.jobs)
        bench.wait_empty(timeout=600, proc=proc)
        wall = time.perf_counter() - began
        worker = psutil.Process(proc.pid)
        workers = [worker, *worker.children(recursive=True)] if args.no_spy else worker.children(recursive=True)
        times = [w.cpu_times() for w in workers]
        switches = [w.num_ctx_switches() for w in workers]
        print(
            f"worker CPU (start to done, boot included): user {sum(t.user for t in times):.2f}s,"
            f" system {sum(t.system for t in times):.2f}s; context switches: voluntary"
            f" {sum(c.voluntary for c in switches):,}, involuntary {sum(c.involuntary for c in switches):,}"
        )
    finally:
        if args.no_spy:
            bench.stop_worker(proc)
        else:
            # py-spy forwards nothing: stop the worker (its child) and let py-spy write.
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.terminate()
            proc.wait(timeout=60)
    ((registered, first, last, n),) = bench.sql(
        "SELECT (SELECT min(started_at) FROM shardq_worker), min(finished_at), max(finished_at), count(*)"
        " FROM shardq_job WHERE status = 'SUCCESSFUL'"
    )
    print(
        f"{n} jobs in {wall:.2f}s ({n / wall:,.0f} jobs/s wall); registered +{(registered - db_start).total_seconds():.2f}s,"
        f" first done +{(first - db_start).total_seconds():.2f}s, last +{(last - db_start).total_seconds():.2f}s,"
        f" steady {(n - 1) / max((last - first).total_seconds(), 1e-9):,.0f} jobs/s"
    )
    for (stats,) in bench.sql("SELECT stats FROM shardq_worker"):
        if stats.get("ack_writes"):
            print(
                f"claims: {stats.get('claim_statements', 0):,} statements, {stats.get('claimed', 0):,} jobs;"
                f" acks: {stats['ack_writes']:,} statements,"
                f" {stats.get('succeeded', 0) / stats['ack_writes']:.0f} outcomes each;"
                f" start writes {stats.get('start_writes', 0):,}"
            )
    # The ramp: how long after the first finish each share of the jobs was done.
    shares = (0.01, 0.05, 0.1, 0.25, 0.5, 0.9)
    ((*marks,),) = bench.sql(
        "SELECT "
        + ", ".join(f"percentile_disc({q}) WITHIN GROUP (ORDER BY finished_at)" for q in shares)
        + " FROM shardq_job WHERE status = 'SUCCESSFUL'"
    )
    print(
        "ramp (after the first finish): "
        + ", ".join(
            f"{q:.0%} done +{(m - first).total_seconds() * 1e3:.0f} ms" for q, m in zip(shares, marks, strict=True)
        )
    )
    buckets = bench.sql(
        "SELECT floor(extract(epoch FROM finished_at - %s) * 10)::int AS b, count(*) FROM shardq_job"
        " WHERE status = 'SUCCESSFUL' GROUP BY b ORDER BY b",
        (first,),
    )
    print("jobs per 100 ms after the first finish: " + " ".join(str(n) for _b, n in buckets))
    bench.reset()
    bench.conn.close()
    if not args.no_spy:
        summarize(raw, args.top)
        print("-- without the main thread (boot) --")
        summarize(raw, args.top, skip_main=True)


if __name__ == "__main__":
    main()
