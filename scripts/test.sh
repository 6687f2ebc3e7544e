#!/usr/bin/env bash
# The test suite: lint, then every test (unit, integration with real sshd, e2e with torchrun)
# except the long soak trials, which `scripts/soak.sh` (`make soak`) runs; each of those has a
# short version here.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check orchestrator trainer tests bench
set +e
.venv/bin/pytest -q -p no:cacheprovider --durations=15 -m "not soak" tests "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "no tests were collected: that is a failure" >&2
    exit 1
fi
exit "$code"
