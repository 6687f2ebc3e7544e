#!/usr/bin/env bash
# The long trials: seeded random spot reclaims during one run, repeated controller kills.
# Each has a short version in the regular suite (scripts/test.sh); these take tens of minutes.
# Then every property test with all of its examples and the ledger kill trials at full length
# (the regular suite runs a quarter of the examples and shorter trials), and the unit tests on
# every other supported Python (the regular suite runs them on the next one only).
set -euo pipefail
cd "$(dirname "$0")/.."
set +e
.venv/bin/pytest -q -p no:cacheprovider --durations=15 -m soak tests "$@"
code=$?
ORCH_FULL_FUZZ=1 .venv/bin/pytest -q -p no:cacheprovider tests/unit tests/integration/test_ledger_crash.py "$@" || code=1
bash scripts/other_pythons.sh all || code=1  # the unit tests on every other supported Python
set -e
if [ "$code" -eq 5 ]; then
    echo "no soak trials were collected: that is a failure" >&2
    exit 1
fi
exit "$code"
