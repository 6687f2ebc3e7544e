# Two commands matter: `make demo` (install everything, run the demo job) and `make test`.
SHELL := /bin/bash
ORCH := .venv/bin/orch
PYTEST := .venv/bin/pytest

.PHONY: setup demo test test-fast lint bench clean-nodes infra-test docs-simulate

setup:
	@bash scripts/setup.sh

# Local nodes cost nothing; the demo prices them so that the bill has something to show.
DEMO_PRICE ?= 0.50

demo: setup
	ORCH_LOCAL_PRICE_PER_HOUR=$${ORCH_LOCAL_PRICE_PER_HOUR:-$(DEMO_PRICE)} \
		$(ORCH) submit templates/demo-ddp.yaml --nodes 2 --gpus 2
	$(ORCH) cost

test: setup
	bash scripts/test.sh

test-fast: setup
	$(PYTEST) -q -m "not e2e" tests

lint: setup
	.venv/bin/ruff check orchestrator trainer tests bench
	.venv/bin/ruff format --check orchestrator trainer tests bench

bench: setup
	.venv/bin/python bench/launch_overhead.py
	.venv/bin/python bench/sync_speed.py
	.venv/bin/python bench/trainer_throughput.py

clean-nodes: setup
	$(ORCH) reconcile

infra-test: setup
	bash scripts/infra_test.sh

# The spot deadline sweep: the generated part of docs/spot-deadlines.md and its PNG.
SPOT_TRACES ?= ../shared/spot-traces

docs-simulate: setup
	.venv/bin/python -m orchestrator.cli simulate --sweep --out-dir docs --overhead-minutes 12 --job-hours 10 --job-hours 40 \
		$(addprefix --trace ,$(sort $(wildcard $(SPOT_TRACES)/*.json)))
