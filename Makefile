# Two commands matter: `make demo` (install everything, run the demo job) and `make test`.
SHELL := /bin/bash
ORCH := .venv/bin/orch
PYTEST := .venv/bin/pytest

.PHONY: setup setup-tests demo test soak test-fast lint bench docs clean-nodes infra-test docs-simulate

setup:
	@bash scripts/setup.sh

# setup, plus the system packages only the tests use (a firewall, Docker's daemon)
setup-tests:
	@bash scripts/setup.sh --tests

# Local nodes cost nothing; the demo prices them so that the bill has something to show.
DEMO_PRICE ?= 0.50

demo: setup
	ORCH_LOCAL_PRICE_PER_HOUR=$${ORCH_LOCAL_PRICE_PER_HOUR:-$(DEMO_PRICE)} \
		$(ORCH) submit templates/demo-ddp.yaml --nodes 2 --gpus 2
	$(ORCH) cost

test: setup-tests
	bash scripts/test.sh

# The long trials (many reclaims, many controller kills); slow, not part of `make test`.
soak: setup-tests
	bash scripts/soak.sh

test-fast: setup-tests
	$(PYTEST) -q -m "not e2e" tests

lint: setup
	.venv/bin/ruff check orchestrator orch_trainer trainer tests bench
	.venv/bin/ruff format --check orchestrator orch_trainer trainer tests bench

# Every benchmark of bench/, one after another; writes docs/benchmarks.md (a failing benchmark
# is reported there). BENCH_ARGS=--quick: fewer repetitions, for a loaded machine.
BENCH_ARGS ?=

bench: setup
	.venv/bin/python -m bench.run_all $(BENCH_ARGS)

# The generated parts of the docs: the job spec field table and the command reference.
docs: setup
	.venv/bin/python -m orchestrator.cli.reference

clean-nodes: setup
	$(ORCH) reconcile

infra-test: setup
	bash scripts/infra_test.sh

# The spot deadline sweep: the generated part of docs/spot-deadlines.md and its PNG.
SPOT_TRACES ?= traces

docs-simulate: setup
	.venv/bin/python -m orchestrator.cli simulate --sweep --out-dir docs --overhead-minutes 12 --job-hours 10 --job-hours 40 \
		$(addprefix --trace ,$(sort $(wildcard $(SPOT_TRACES)/*.json)))
	.venv/bin/python -m orchestrator.cli simulate --sweep --zones --out-dir docs --overhead-minutes 12 \
		--migration-minutes 20 --job-hours 10 --job-hours 40 \
		$(addprefix --trace ,$(sort $(wildcard $(SPOT_TRACES)/*.json)))
