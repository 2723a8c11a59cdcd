# gangshare developer entry points. `make test` is what CI runs (via .ci/run).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test protos lint typecheck contracts unit bench results clean venv k8s dev-up dev-down demo panels image

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

typecheck: $(STAMP) protos
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP) protos
	$(BIN)/pytest tests/unit -q

# The kubelet device-plugin and PodResources gRPC stubs, generated from k8s.io/kubelet's
# api.proto (Go module proxy) into src/gangshare/agent/kubeletapi/ (git-ignored build output).
protos: $(STAMP)
	bash scripts/gen-kubelet-api.sh $(BIN)/python

# Kubernetes binaries (and Prometheus, for the dashboards' test) from Go modules, cached by version
# outside the repo (cold: long; warm: instant).
k8s:
	bash scripts/build-k8s.sh

# gangshare's image and the chart's kube-scheduler image as docker-archives, built without pulling
# anything (src/gangshare/dev/release_image.py; cached by content under ~/.cache/gangshare/images);
# prints each image's name and tarball, for `ctr -n k8s.io images import`.
image: $(STAMP) protos k8s node-deps
	$(BIN)/python -m gangshare.dev.release_image

# containerd, runc, CNI plugins and busybox for the real kubelet node of the e2e tests
# (src/gangshare/dev/realnode.py); installs only what is missing, needs root then.
.PHONY: node-deps
node-deps:
	bash scripts/install-node-deps.sh

# The full suite: static checks, the purity contract, then every test (unit, integration, e2e).
test: protos lint typecheck contracts k8s node-deps
	$(BIN)/pytest -q

# The newcomer's first command: local cluster, operator, sample jobs, status table until done.
demo: $(STAMP) protos k8s
	$(BIN)/gangshare demo

# docs/img/queues-panel.png: panels of deploy/grafana/gangshare-queues.json drawn from a real
# Prometheus over tests/e2e/test_prometheus.py's workload (borrowing, reclaim, a user error).
panels: $(STAMP) protos k8s
	GANGSHARE_RENDER_PANELS=1 $(BIN)/pytest -q tests/e2e/test_prometheus.py

dev-up: $(STAMP) k8s
	$(BIN)/gangshare dev up

dev-down: $(STAMP)
	$(BIN)/gangshare dev down

bench: $(STAMP)
	$(BIN)/python bench/placement.py
	$(BIN)/python bench/operator_cycle.py
	$(BIN)/python bench/simulator.py
	$(BIN)/python bench/predictor.py
	$(BIN)/python bench/extender.py

# Regenerate docs/results.md and docs/results/ (the simulator on Philly and Alibaba 2023; ~38 min on 2 cores).
results: $(STAMP)
	$(BIN)/python -m gangshare.sim.report

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

# ----- Helm and kind ------------------------------------------------------------------------------
# kind-up/kind-down need Docker, kind, helm and kubectl on PATH; they are for trying the chart on a
# laptop and are not part of `make test` (tests/e2e/test_helm.py installs the chart into the local
# control plane instead). helm defaults to the project's own build when it exists.
KIND ?= kind
KUBECTL ?= kubectl
HELM ?= $(or $(wildcard $(shell bash scripts/build-k8s.sh --print-bin-dir)/helm),helm)
KIND_CLUSTER ?= gangshare
KIND_IMAGE ?=
CHART := deploy/helm/gangshare
RELEASE_NAMESPACE ?= gangshare-system

.PHONY: kind-up kind-down helm-template

kind-up: protos
	$(KIND) create cluster --name $(KIND_CLUSTER) --config deploy/kind/cluster.yaml \
		$(if $(KIND_IMAGE),--image $(KIND_IMAGE)) --wait 120s
	docker build -t gangshare:dev .
	$(KIND) load docker-image gangshare:dev --name $(KIND_CLUSTER)
	$(HELM) install gangshare $(CHART) -n $(RELEASE_NAMESPACE) --create-namespace \
		--kube-context kind-$(KIND_CLUSTER) \
		--set image.repository=gangshare --set image.tag=dev
	$(KUBECTL) --context kind-$(KIND_CLUSTER) -n $(RELEASE_NAMESPACE) rollout status \
		deployment/gangshare-operator deployment/gangshare-scheduler --timeout 180s

kind-down:
	$(KIND) delete cluster --name $(KIND_CLUSTER)

# Every manifest the chart installs, CRD included, with default values (pass more with ARGS=...).
helm-template:
	$(HELM) template gangshare $(CHART) -n $(RELEASE_NAMESPACE) --include-crds $(ARGS)
