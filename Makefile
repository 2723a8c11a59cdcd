# gangshare developer entry points. `make test` is what CI runs (via .ci/run).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck contracts unit bench clean venv k8s dev-up dev-down demo

# The virtual environment is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

# Kubernetes binaries from Go modules, cached by version outside the repo (cold: long; warm: instant).
k8s:
	bash scripts/build-k8s.sh

# The full suite: static checks, the purity contract, then every test (unit, integration, e2e).
test: lint typecheck contracts k8s
	$(BIN)/pytest -q

# The newcomer's first command: local cluster, operator, sample jobs, status table until done.
demo: $(STAMP) k8s
	$(BIN)/gangshare demo

dev-up: $(STAMP) k8s
	$(BIN)/gangshare dev up

dev-down: $(STAMP)
	$(BIN)/gangshare dev down

bench: $(STAMP)
	$(BIN)/python bench/placement.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
