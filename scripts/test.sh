#!/usr/bin/env bash
# The test suite: lint, then every test (unit, integration with real sshd, e2e with torchrun)
# except the long soak trials, which `scripts/soak.sh` (`make soak`) runs; each of those has a
# short version here.
#
# Four streams go side by side, so that the suite takes about as long as its longest one; most
# tests wait (on sshd, moto, terraform, guards and controllers timed against limits) far more
# than they compute, so a two-core machine has room for them. The e2e tests run one at a time,
# as they must: each starts real jobs and times nodes, controllers and guards against limits;
# those of the AWS sandbox go in a second such stream, after the controller host's integration
# tests (each drives a host and its jobs for a minute or more). The other integration tests
# make the third stream. The unit and infra tests make the fourth, and after them the unit
# tests of the code most bound to the Python version (the node runtime, the spec) run again on
# the next supported Python found, 3.12 (scripts/other_pythons.sh; `make soak` runs every unit
# test on every one, 3.13 too; a machine with none says so and is not failed for it), then the
# e2e tests of container jobs and of bucket data, whose nodes have bridges of their own, with
# the sandbox host's podman run. Once every stream has ended, the dashboard's e2e run in a real
# Chromium goes alone.
# Arguments (`make test` passes none) select tests for a single run instead:
# `bash scripts/test.sh tests/unit -k spec`.
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

# One stream in the background: its output in $logs/NAME.log, its exit code in $logs/NAME.code.
stream() {
    local name=$1
    shift
    (
        set +e
        "$@" >"$logs/$name.log" 2>&1
        echo $? >"$logs/$name.code"
    ) &
    pids+=($!)
}

# On the next Python, the tests of the code most bound to the interpreter's version: what runs
# on the nodes' own Python, whatever it is (the node runtime), and the spec's models that read
# every user's input. `make soak` runs every unit test on every Python.
other_python_tests=(tests/unit/node tests/unit/spec)

# The unit tests compute where the other streams wait on timed nodes and controllers: they
# run at a lower priority, so that they never hold up those.
unit_then_others() {
    local code=0
    nice -n 10 .venv/bin/pytest -q -p no:cacheprovider --durations=15 -m "not soak" \
        tests/unit tests/infra || code=$?
    verdict "$code" "tests/unit, tests/infra" || code=1
    echo
    echo "--- unit tests on the next supported Python (after them) ---"
    nice -n 10 bash scripts/other_pythons.sh 1 "${other_python_tests[@]}" || code=1
    echo
    echo "--- the e2e tests of container jobs and bucket data, and the sandbox host's podman run (after them, at the usual priority) ---"
    pytest_run "${containers[@]}" "$podman_test" || code=1
    return "$code"
}

# The two timed streams: the e2e tests on local nodes, and the controller host's integration
# tests then the e2e tests on the AWS sandbox.
# The fleet's e2e run joins them: its machines sit on a bridge and subnet of their own. So do
# the browser harness's and the live dashboard's tests in a real Chromium, the shortest stream's.
browser_tests=(tests/integration/test_browser_harness.py tests/integration/test_dashboard_live.py)
# The dashboard's e2e run (real jobs, every page, in Chromium) comes last, alone: Chromium drops
# and stalls page loads while the machine's network keeps changing (every other stream's tests
# add and remove nodes' namespaces and bridges), which on a loaded machine outlasts its jobs.
dashboard_e2e=tests/e2e/test_dashboard.py
# Two slow integration files join them too, so that the streams end about together: the fleet's
# CLI (machines on the fleet's subnet, as its e2e run) and the fencing of paused controllers.
moved=(tests/integration/test_fleet_cli.py tests/integration/test_fencing.py)
hosts=(tests/integration/test_controller_host*.py tests/e2e/test_sandbox_*.py tests/e2e/test_fleet.py
    "${browser_tests[@]}" "${moved[@]}")
# The e2e tests of container jobs and of bucket data end the unit stream, which finishes
# minutes before the others: their nodes sit on bridges and subnets of their own, so they meet
# no other e2e test's.
containers=(tests/e2e/test_container_job.py tests/e2e/test_bucket_data.py)
# The sandbox host's podman run compares the machine's podman leftovers (cgroups, mounts) before
# and after, as the container jobs' tests do: it runs with them, one after the other, so that
# neither sees the other's containers.
podman_test=tests/integration/test_sandbox.py::test_a_host_pulls_a_private_image_from_the_gateway_and_runs_it_on_its_network
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
stream hosts pytest_run "${hosts[@]}"
stream integration pytest_run tests/integration --ignore-glob='tests/integration/test_controller_host*.py' \
    --deselect "$podman_test" --ignore=tests/integration/test_browser_harness.py \
    --ignore=tests/integration/test_dashboard_live.py "${moved[@]/#/--ignore=}"
stream unit unit_then_others

set +e
pytest_run tests/e2e --ignore-glob='tests/e2e/test_sandbox_*.py' --ignore=tests/e2e/test_fleet.py \
    --ignore="$dashboard_e2e" "${containers[@]/#/--ignore=}"
e2e_code=$?
wait "${pids[@]}"
echo
echo "--- the dashboard's e2e run in Chromium (after every stream) ---"
pytest_run "$dashboard_e2e"
dashboard_code=$?
set -e

status=0
verdict "$e2e_code" "tests/e2e" || status=1
verdict "$dashboard_code" "$dashboard_e2e" || status=1
for name in hosts integration unit; do
    case $name in
        hosts) what="tests/integration, the controller host's, then tests/e2e on the AWS sandbox and the fleet, and the browser harness and live dashboard in Chromium" ;;
        integration) what="tests/integration, the others" ;;
        unit) what="tests/unit, tests/infra, tests/unit on the next Python, then the container and bucket e2e tests and the sandbox's podman run" ;;
    esac
    echo
    echo "--- $what (run beside the e2e tests) ---"
    cat "$logs/$name.log"
    verdict "$(cat "$logs/$name.code")" "$what" || status=1
done
exit "$status"
