# fairpost: every target sets up what it needs (scripts/bootstrap.sh) first.
#
#   make demo     the demo, with its own Redis and AWS emulator
#   make test     lint, types, Dockerfile lint, the whole test suite, then the dependency floors
#   make test-fast  the fast tier only: the sender's decisions against fakes, no servers (seconds)
#   make test-stress  the whole test suite while stress-ng keeps every core busy
#   make faults   the whole fault matrix (make test runs a sample of it)
#   make fuzz     the property tests (tests/properties) with many more examples
#   make lint     ruff (check and format), hadolint and the layer contracts (lint-imports)
#   make types    mypy only
#   make floors   the SDK's and daemon's tests at the lowest versions pyproject.toml allows
#   make bench    the benchmarks
#   make clean    caches and build output (make distclean: the virtualenvs too)
#
# Pass pytest options with PYTEST_ARGS, e.g. make test PYTEST_ARGS='-m "not slow" -x'.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

BIN := .venv/bin
BOOTSTRAP := bash scripts/bootstrap.sh
PYTEST_ARGS ?=
# Two workers (pytest-xdist): each starts its own Redis and emulators. PYTEST_WORKERS= runs serially.
PYTEST_WORKERS ?= -n 2

test-stress:
	FAIRPOST_BOOTSTRAP_STRESS=1 $(BOOTSTRAP) test
	bash scripts/test-stress.sh $(PYTEST_ARGS)

.PHONY: help demo test test-fast test-stress faults fuzz lint types pytest floors bench clean distclean bootstrap-test bootstrap-demo

help:
	@sed -n '3,13p' $(firstword $(MAKEFILE_LIST)) | sed 's/^# *//'

bootstrap-test:
	$(BOOTSTRAP) test

bootstrap-demo:
	$(BOOTSTRAP) demo

demo: bootstrap-demo
	$(BIN)/fairpost demo

test: lint types pytest floors

# tests/daemon/unit: fakes in one process, no Redis, no emulators, no workers to
# start; under 60 s (a few seconds here), for the edit-test loop.
test-fast: bootstrap-test
	$(BIN)/pytest tests/daemon/unit $(PYTEST_ARGS)

lint: bootstrap-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile
	$(BIN)/lint-imports

types: bootstrap-test
	$(BIN)/mypy

# Exit code 5 means pytest collected no tests: a broken testpaths or marker
# selection, never a pass. Say so instead of failing with a bare code.
pytest: bootstrap-test
	$(BIN)/pytest $(PYTEST_WORKERS) $(PYTEST_ARGS) || { rc=$$?; \
	  if [[ $$rc == 5 ]]; then echo 'make: pytest collected no tests (exit 5); check testpaths and -m/-k in PYTEST_ARGS' >&2; fi; \
	  exit $$rc; }

# Every direct dependency at the lowest version pyproject.toml allows, in .venv-floors
# (rebuilt only when pyproject.toml changes), then the SDK's tests and the daemon end
# to end on it (scripts/floors.sh): a floor that no longer works fails here.
floors: bootstrap-test
	bash scripts/floors.sh

# A fault at every step the pipeline takes (tests/faults): each recorded Redis,
# SQS and SES call failed in turn, its request lost and then its answer.
faults: bootstrap-test
	FAIRPOST_FAULT_MATRIX=all $(BIN)/pytest -m faults $(PYTEST_ARGS)

# The property tests of every parser that takes outside input: make test runs each
# with a fixed budget of examples (hypothesis profile "ci"), this with many more.
fuzz: bootstrap-test
	FAIRPOST_HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/properties --timeout 1800 $(PYTEST_ARGS)

bench: bootstrap-test
	$(BIN)/python -m bench

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
	find . -path ./.venv -prune -o -path ./.localstack-venv -prune -o -path ./.git -prune -o \
	  -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf .venv .localstack-venv .venv-floors .releases
