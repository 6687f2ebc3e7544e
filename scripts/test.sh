#!/usr/bin/env bash
# The test suite: lint, then every test (unit, integration with real sshd, e2e with torchrun)
# except the long soak trials, which `scripts/soak.sh` (`make soak`) runs; each of those has a
# short version here.
#
# The tests mostly wait (on nodes, controllers, timeouts), so they run in parallel workers:
# ORCH_TEST_WORKERS (default 3) of them; tests that need a machine-wide resource (the sandbox)
# take turns (tests/conftest.py). ORCH_TEST_WORKERS=0 runs everything in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check orchestrator trainer tests bench
workers=${ORCH_TEST_WORKERS:-3}
parallel=()
if [ "$workers" -gt 0 ]; then
    parallel=(-n "$workers")
fi
set +e
.venv/bin/pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" -m "not soak" tests "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "no tests were collected: that is a failure" >&2
    exit 1
fi
exit "$code"
