# Two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv and install everything themselves (`pip install -e '.[dev]'`:
# shardq plus the example project's, tests' and linters' dependencies).
SHELL := /bin/bash
# The first Python 3.12 that really runs (a pyenv shim may exist yet refuse).
PYTHON312 := $(shell for p in python3.12 $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python 2>/dev/null | sort -V -r) /usr/bin/python3.12 /usr/local/bin/python3.12; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast venv bench side-by-side bench-cancel soak soak-history bench-history faults scale clean chromium pgbouncer lint workflows limits-full durable acceptance-full fairness

$(STAMP): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found: install python3.12 (or pyenv install 3.12)"; exit 1; }
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Ends by serving the admin (URL and login printed) until Ctrl-C; DEMO_EXIT=1
# stops at once (CI). An embedded PostgreSQL it started is stopped with it.
demo: $(STAMP)
	$(PY) manage.py shardq_demo

# The suite runs in parallel under pytest-xdist, each xdist worker on a test
# database of its own (CONTRIBUTING.md, "The test tiers"); loadgroup keeps the
# tests of one xdist_group on one worker. TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup
# The fast tier on three xdist workers: its tests wait (in-process workers'
# polls, due times, the database) as much as they compute, and on the 2-core
# machine -n 3 ran it in 225 s against 310 s for -n 2 (load 4-5.5), where
# -n 4 took 295 s (load 5.6-9.3): CONTRIBUTING.md, "The third pass".
TEST_FAST_WORKERS ?= 3
# Bytecode caches on for the test run even when the environment turns them
# off (PYTHONDONTWRITEBYTECODE=1): without them every xdist worker rewrites
# and compiles every test module again (about a minute of collection each on
# a loaded 2-core box), and every worker process a test starts compiles
# shardq and the example project again (2-3x its start-up). __pycache__/ is
# in .gitignore.
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

test: $(STAMP) chromium pgbouncer
	$(PYTEST) -q $(XDIST)

# The fast tier: every test that starts no process (tests/conftest.py marks
# the others `process`); CONTRIBUTING.md gives its measured times.
test-fast: $(STAMP)
	$(PYTEST) -q -n $(TEST_FAST_WORKERS) --dist loadgroup -m "not process"

# The browser tests (tests/browser) drive Debian's chromium through Playwright:
# `playwright install` downloads a browser build of its own, which a machine
# that reaches only the package registries cannot do.
CHROMIUM := /usr/bin/chromium
chromium:
	@if [ -x $(CHROMIUM) ]; then exit 0; fi; \
	command -v apt-get >/dev/null 2>&1 || { \
		echo "$(CHROMIUM) is missing and apt-get is not available: install Chromium (Debian's package is 'chromium')"; \
		echo "so that $(CHROMIUM) exists; the admin's browser tests in tests/browser drive it."; exit 1; }; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else \
		echo "$(CHROMIUM) is missing: run 'apt-get update && apt-get install -y --no-install-recommends chromium' as root."; exit 1; fi; \
	echo "installing Debian's chromium for the browser tests (tests/browser)"; \
	$$SUDO apt-get update && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends chromium && \
	test -x $(CHROMIUM) || { echo "apt-get installed chromium but $(CHROMIUM) does not exist"; exit 1; }

# The PgBouncer test (tests/acceptance/test_pgbouncer.py) starts Debian's
# pgbouncer on a port of its own in front of the test database.
PGBOUNCER := /usr/sbin/pgbouncer
pgbouncer:
	@if [ -x $(PGBOUNCER) ]; then exit 0; fi; \
	command -v apt-get >/dev/null 2>&1 || { \
		echo "$(PGBOUNCER) is missing and apt-get is not available: install PgBouncer (Debian's package is 'pgbouncer')"; \
		echo "so that $(PGBOUNCER) exists; tests/acceptance/test_pgbouncer.py starts it."; exit 1; }; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else \
		echo "$(PGBOUNCER) is missing: run 'apt-get update && apt-get install -y --no-install-recommends pgbouncer' as root."; exit 1; fi; \
	echo "installing Debian's pgbouncer for the PgBouncer test (tests/acceptance/test_pgbouncer.py)"; \
	$$SUDO apt-get update && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends pgbouncer && \
	test -x $(PGBOUNCER) || { echo "apt-get installed pgbouncer but $(PGBOUNCER) does not exist"; exit 1; }

# Full fault sizes (the fault suite, the randomized failure-domain run and the
# property over every value of every job column);
# -s shows each test's [faults] figures line (docs/reliability.md).
faults: $(STAMP)
	SHARDQ_FULL_FAULTS=1 $(PY) -m pytest -q -s tests/faults tests/isolation/test_randomized.py tests/isolation/test_row_properties.py

# Full scale (issue 17, docs/scaling.md): 16 worker processes on 64 shards
# with a 5-minute stable window, and workers in network namespaces; -s shows
# each test's figures line. `make test` runs the CI sizes.
scale: $(STAMP)
	SHARDQ_FULL_SCALE=1 $(PY) -m pytest -q -s tests/scale

# Workflows at the issue's sizes (docs/workflows.md): the EXPLAIN test with
# 1M WAITING rows, the 1 -> 9,998 -> 1 fan-out/fan-in over 3 workers, the
# SIGKILL churn; then bench/workflows.py (graph enqueue against enqueue_many,
# a drain beside 1M WAITING rows against none).
workflows: $(STAMP)
	SHARDQ_FULL_WORKFLOWS=1 SHARDQ_FULL_FAULTS=1 $(PY) -m pytest -q -s tests/integration/test_claim_plan.py \
		tests/acceptance/test_workflows.py tests/faults/test_workflow_churn.py
	$(PY) bench/workflows.py

# Durable long jobs at the issue's sizes (docs/durable.md): 20,000 items in
# batches of 100 with the owner SIGKILLed 2 s into each run, 10 rolling
# deploys by SIGTERM during a 60 s iteration; with the in-process figures
# (signal pickup, sleep wake, 100,000 suspended jobs beside the claim).
durable: $(STAMP)
	SHARDQ_FULL_FAULTS=1 $(PY) -m pytest -q -s tests/faults/test_durable_churn.py \
		tests/integration/test_durable.py tests/integration/test_durable_plan.py

# The limits' acceptance tests at full size: the rate figure over 30 s
# (make test runs it over 6 s); -s shows each test's [limits] figures line.
limits-full: $(STAMP)
	SHARDQ_LIMITS_FULL=1 $(PY) -m pytest -q -s tests/acceptance/test_limits.py

# The tests CI runs smaller at their full size: two workers draining 5,000
# ledger jobs, and one thread running 2,000 jobs in priority order.
acceptance-full: $(STAMP)
	SHARDQ_FULL_ACCEPTANCE=1 $(PY) -m pytest -q tests/integration/test_priority_order.py \
		tests/acceptance/test_worker.py::test_two_workers_run_ledger_jobs_once_each_and_split_shards_32_32
# Fair share inside a queue at the issue's sizes (issue 25, docs/fairness.md):
# the acceptance scenarios in full, then bench/fairness.py (the cost drain and
# the noisy neighbour with fairness on and off).
fairness: $(STAMP)
	SHARDQ_FAIRNESS_FULL=1 $(PY) -m pytest -q -s tests/acceptance/test_fairness.py
	$(PY) bench/fairness.py --database shardq_fairness_bench

# bench/run.py --help for its flags (--only, --rounds, --no-docs, ...); then a
# 20k burst into an idle worker (bench/burst.py) and the worker's boot by stage
# (bench/boot.py), both on DATABASE_URL's database.
bench: $(STAMP)
	$(PY) bench/run.py
	$(PY) bench/burst.py
	$(PY) bench/boot.py

# shardq beside pgqueuer (bench/side_by_side.py: 10,000 no-op jobs, each queue's
# defaults, 1 and 2 workers, 3 interleaved rounds); pgqueuer comes from the
# `bench` extra installed here. Not part of CI.
side-by-side: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/side_by_side.py

# Sustained load through the example project's gunicorn, 15 minutes at 70 %
# of the measured peak, then a drain beside 5M finished rows (about 25
# minutes in all; bench/soak.py --help for shorter runs).
# The latency from shardq.cancel() to a running task seeing it (p50/p99 over
# 200 cancels of each kind, one real worker); figures in docs/benchmarks.md.
bench-cancel: $(STAMP)
	mkdir -p bench/results
	SHARDQ_CANCEL_SAMPLES=200 SHARDQ_CANCEL_RESULTS=bench/results/cancel_latency.json $(PY) -m pytest -q -s \
		tests/integration/test_run_control.py -k cancel_latency

# bench-bulk: retry 100,000 dead letters while two workers drain (bench/bulk_retry.py)
.PHONY: bench-bulk
bench-bulk: $(STAMP)
	DJANGO_SETTINGS_MODULE=tests.settings PYTHONPATH=. $(PY) manage.py migrate -v 0
	DJANGO_SETTINGS_MODULE=tests.settings PYTHONPATH=. $(PY) bench/bulk_retry.py

# bench-pause: how fast a pause stops two draining workers (bench/pause.py)
.PHONY: bench-pause
bench-pause: $(STAMP)
	DJANGO_SETTINGS_MODULE=tests.settings PYTHONPATH=. $(PY) manage.py migrate -v 0
	DJANGO_SETTINGS_MODULE=tests.settings PYTHONPATH=. $(PY) bench/pause.py
# bench-joblogs: per-job logs' cost (bench/ab_job_logs.py): what the feature adds
# to one attempt, timed in-process, then the no-op drain with it on and off,
# alternated (8 rounds of 20,000 jobs); figures in docs/benchmarks.md.
.PHONY: bench-joblogs
bench-joblogs: $(STAMP)
	$(PY) bench/ab_job_logs.py --micro
	$(PY) bench/ab_job_logs.py --rounds 8
# bench-admin: the admin at 10,000,000 jobs, every page timed server-side (bench/admin_10m.py;
# its own database, filled once, ~10 min). bench-search-cost: the argument index on the hot path.
.PHONY: bench-admin bench-search-cost
bench-admin: $(STAMP)
	$(PY) bench/admin_10m.py

bench-search-cost: $(STAMP)
	$(PY) bench/search_index_cost.py

soak: $(STAMP)
	$(PY) bench/soak.py

# ruff, ruff format and mypy as configured in pyproject.toml (pre-commit runs
# the same); .ci/run calls it after `make test`.
lint: $(STAMP)
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

# The embedded PostgreSQL first: deleting .pgdata under a running server
# leaves it running on deleted files.
clean:
	@if [ -x $(PY) ]; then $(PY) -c 'from shardq import embedded; embedded.stop()'; fi
	rm -rf $(VENV) .pgdata .demo bench/results build dist

# History off the hot table (issue 27 §1, docs/benchmarks.md "History"):
# bench/history.py's drain with 10M finished rows in history against none,
# the hot path's CPU against BASELINE (a checkout of main, when given), and a
# day of 5M rows dropped; soak-history holds 70 % of peak with history kept
# 10 minutes and plots the hot table's sizes (MINUTES=60 by default).
bench-history: $(STAMP)
	$(PY) bench/history.py $(if $(BASELINE),--baseline $(BASELINE))

MINUTES ?= 60
soak-history: $(STAMP)
	$(PY) bench/soak_history.py --minutes $(MINUTES)
