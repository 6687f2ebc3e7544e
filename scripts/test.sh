#!/usr/bin/env bash
# The test suite: lint, then every test (unit, integration with real sshd, e2e with torchrun)
# except the long soak trials, which `scripts/soak.sh` (`make soak`) runs; each of those has a
# short version here.
#
# Three pytest streams go side by side, so that the suite takes about as long as its longest
# stream. The e2e tests run one at a time, as they must: each starts real jobs and times nodes,
# controllers and guards against limits; after them, in the same stream, the unit tests that do
# not need torch run again on the next supported Python found, 3.12 (scripts/other_pythons.sh;
# `make soak` runs them on every one, 3.13 too; a machine with none says so and is not failed
# for it). The integration tests run beside them: they mostly wait on sshd, moto and real
# jobs' controllers. The unit and infra tests (CPU for a minute or two, then terraform and
# moto) make the third stream, which ends long before the others. Arguments (`make test` passes none) select tests
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

# One stream: its pytest run's output in $logs/NAME.log, its exit code in $logs/NAME.code.
stream() {
    local name=$1
    shift
    set +e
    pytest_run "$@" >"$logs/$name.log" 2>&1
    echo $? >"$logs/$name.code"
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
stream integration tests/integration &
integration_pid=$!
stream unit tests/unit tests/infra &
unit_pid=$!

set +e
pytest_run tests/e2e
e2e_code=$?
bash scripts/other_pythons.sh 1 >"$logs/others.log" 2>&1
others_code=$?
wait "$integration_pid" "$unit_pid"
set -e

status=0
verdict "$e2e_code" "tests/e2e" || status=1
for name in unit integration; do
    what="tests/$name"
    [ "$name" = unit ] && what="tests/unit, tests/infra"
    echo
    echo "--- $what (run beside the e2e tests) ---"
    cat "$logs/$name.log"
    verdict "$(cat "$logs/$name.code")" "$what" || status=1
done
echo
echo "--- unit tests on the next supported Python (after the e2e tests) ---"
cat "$logs/others.log"
[ "$others_code" -eq 0 ] || status=1
exit "$status"
