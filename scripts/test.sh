#!/usr/bin/env bash
# The test suite: lint, then every test (unit, integration with real sshd, e2e with torchrun)
# except the long soak trials, which `scripts/soak.sh` (`make soak`) runs; each of those has a
# short version here.
#
# Two pytest runs go side by side. The e2e tests run one at a time, as they must: each starts
# real jobs and times nodes, controllers and guards against limits. The unit, integration and
# infra tests run beside them: they mostly wait on sshd, moto and terraform, and a two-core
# machine has room for them next to one job. After them, in the same pipeline, the unit tests
# that do not need torch run again on the next supported Python found, 3.12
# (scripts/other_pythons.sh; `make soak` runs them on every one, 3.13 too); a machine with none
# says so and is not failed for it. Arguments (`make test` passes none) select tests
# for a single run instead: `bash scripts/test.sh tests/unit -k spec`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check orchestrator orch_trainer trainer tests bench

pytest_run() {
    .venv/bin/pytest -q -p no:cacheprovider --durations=15 -m "not soak" "$@"
}

# pytest's exit code 5 (no tests collected) is a failure too.
verdict() {
    if [ "$1" -eq 5 ]; then
        echo "no tests were collected for $2: that is a failure" >&2
        return 1
    fi
    return "$1"
}

if [ "$#" -gt 0 ]; then
    set +e
    pytest_run "$@"
    code=$?
    set -e
    verdict "$code" "$*"
    exit $?
fi

beside() {
    set +e
    pytest_run tests/unit tests/integration tests/infra >"$logs/beside.log" 2>&1
    echo $? >"$logs/beside.code"
    bash scripts/other_pythons.sh 1 >"$logs/others.log" 2>&1
    echo $? >"$logs/others.code"
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
beside &
beside_pid=$!

set +e
pytest_run tests/e2e
e2e_code=$?
wait "$beside_pid"
beside_code=$(cat "$logs/beside.code")
others_code=$(cat "$logs/others.code")
set -e

echo
echo "--- unit, integration and infra tests (run beside the e2e tests) ---"
cat "$logs/beside.log"
status=0
verdict "$e2e_code" "tests/e2e" || status=1
verdict "$beside_code" "tests/unit, tests/integration, tests/infra" || status=1
echo
echo "--- unit tests on the next supported Python (after them) ---"
cat "$logs/others.log"
[ "$others_code" -eq 0 ] || status=1
exit "$status"
