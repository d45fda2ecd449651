# Two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv and install everything themselves.
SHELL := /bin/bash
# The first Python 3.12 that really runs (a pyenv shim may exist yet refuse).
PYTHON312 := $(shell for p in python3.12 $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python 2>/dev/null | sort -V -r) /usr/bin/python3.12 /usr/local/bin/python3.12; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench faults clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found: install python3.12 (or pyenv install 3.12)"; exit 1; }
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) manage.py shardq_demo

test: $(STAMP)
	$(PY) -m pytest -q

# Full fault sizes; -s shows each test's [faults] figures line (docs/reliability.md).
faults: $(STAMP)
	SHARDQ_FULL_FAULTS=1 $(PY) -m pytest -q -s tests/faults

bench: $(STAMP)
	$(PY) manage.py shardq_bench

clean:
	rm -rf $(VENV) .pgdata .demo bench/results
