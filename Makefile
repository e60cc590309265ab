# Headroom developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
export HEADROOM_BIN_DIR ?= $(HOME)/.cache/headroom/bin/current
PYTEST_ARGS ?=
# make test's workers: the end-to-end tests in one, the rest spread over the others
# (tests/conftest.py); most of a test's time is waiting, not CPU.
TEST_WORKERS ?= 3

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-17s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml requirements/dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: Python 3.11+ is required" >&2; exit 1; }
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt  # the lock: exact versions
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed-* && touch $@

.PHONY: venv
venv: $(STAMP) ## Create the virtualenv with the operator and its dev tools.

LOCK := $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links
.PHONY: lock
lock: venv ## Pin every dependency again (requirements/*.txt, with hashes) after pyproject.toml changed.
	$(LOCK) --output-file requirements/runtime.txt pyproject.toml
	$(LOCK) --extra dev --output-file requirements/dev.txt pyproject.toml

.PHONY: controlplane
controlplane: ## Build (or reuse) kube-apiserver, kubectl and etcd from their Go modules.
	bash hack/controlplane/build.sh

.PHONY: helm
helm: ## Also build helm (chart rendering and install; make dev does not need it).
	bash hack/controlplane/build.sh helm

.PHONY: controllers
controllers: ## Also build kube-controller-manager and kube-scheduler (the tests that need a garbage collector).
	bash hack/controlplane/build.sh kube-controller-manager kube-scheduler

.PHONY: prometheus
prometheus: ## Debian's prometheus and promtool into the cache (apt-get download, no service started): the alert tests.
	bash hack/prometheus.sh

.PHONY: image
image: ## Build the operator's OCI image without a Docker engine (cached; root, Debian packages installed if missing).
	bash hack/node/deps.sh
	bash hack/image/build.sh >/dev/null

.PHONY: node
node: controlplane ## Debian packages (containerd, runc, CNI...), the kubelet and the node's small images, for a real node.
	bash hack/node/deps.sh
	bash hack/node/build.sh >/dev/null
	bash hack/node/images.sh pause busybox kubectl >/dev/null

.PHONY: generate
generate: venv controlplane helm ## Regenerate crds/ and the chart CRDs from the models, manifests/ from the chart.
	$(PY) hack/generate.py

.PHONY: lint
lint: venv ## ruff, mypy --strict and the import-layer contracts.
	$(VENV)/bin/ruff check operator tests hack bench
	$(VENV)/bin/ruff format --check operator tests hack bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

.PHONY: verify
verify: venv controlplane helm lint ## Fail if generated files drifted from their source, or lint fails.
	$(PY) hack/generate.py --check

.PHONY: test-unit
test-unit: venv ## Fast tests of the pure code; no cluster.
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

.PHONY: test
test: venv controlplane helm controllers node image prometheus verify ## Install what is missing, then run every test (unit, integration, e2e; TEST_WORKERS=3).
	$(VENV)/bin/pytest tests -n $(TEST_WORKERS) $(PYTEST_ARGS)

.PHONY: test-integration
test-integration: venv controlplane helm controllers prometheus ## The tests on the real API server (no node, no image).
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: venv controlplane helm controllers node image prometheus ## The end-to-end tests: real kube-scheduler, node, image, make dev.
	$(VENV)/bin/pytest tests/e2e $(PYTEST_ARGS)

.PHONY: sim
sim: venv ## Many more simulation schedules than make test runs (SCHEDULES=20000, BASE=random).
	HEADROOM_SIM_SCHEDULES=$(or $(SCHEDULES),20000) HEADROOM_SIM_BASE=$(or $(BASE),$$RANDOM$$RANDOM) \
		$(VENV)/bin/pytest tests/unit/test_simulation.py -s $(PYTEST_ARGS)

.PHONY: bench
bench: venv controlplane controllers ## Benchmarks (not part of test): core ledger and the operator on the local control plane (PROFILE=1: py-spy the operator in B8).
	mkdir -p bench/results
	$(PY) bench/core.py --json bench/results/core.json
	$(PY) bench/cluster.py $(if $(QUICK),--quick,) --json bench/results/cluster.json
	$(PY) bench/gates.py $(if $(QUICK),--quick,) --json bench/results/gates.json
	$(PY) bench/gpus.py $(if $(QUICK),--quick,) --json bench/results/gpus.json
	$(PY) bench/quotas.py $(if $(QUICK),--quick,) --json bench/results/quotas.json
	$(PY) bench/outlook.py $(if $(QUICK),--quick,) --json bench/results/outlook.json
	$(PY) bench/scheduler.py $(if $(QUICK),--quick,) --json bench/results/scheduler.json
	$(PY) bench/fairness.py $(if $(QUICK),--quick,) --json bench/results/fairness.json $(if $(PROFILE),--profile bench/results/profile,)

.PHONY: dev
dev: venv controlplane ## Local control plane + demo nodes; stays up until Ctrl-C (DEV_ONCE=1: run once, exit).
	$(PY) -m headroom_dev.dev $(if $(DEV_ONCE),--once,)

.PHONY: cluster
cluster: venv controlplane helm controllers node image ## A real node on this machine + the chart installed from the local image + a demo (root; Ctrl-C stops).
	$(PY) -m headroom_dev.makecluster $(if $(CLUSTER_ONCE),--once,)

.PHONY: clean
clean: ## Remove the virtualenv and caches (keeps the built binaries).
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .dev .cluster
