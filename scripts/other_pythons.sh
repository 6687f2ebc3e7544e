#!/usr/bin/env bash
# tests/unit, without the modules that need torch, on other supported Pythons than the main
# venv's 3.11, in venvs of their own without torch (scripts/venvs.py builds them; a Python is
# found on the PATH or under pyenv). `COUNT` of them, oldest first (`make test`: 1, the 3.12
# of Ubuntu 24.04), or `all` (`make soak`). PATHS, when given, are the test folders to run
# instead of all of tests/unit. A machine with none says so and is not failed.
#
#     bash scripts/other_pythons.sh [COUNT|all] [PATH...]
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-all}
shift || true
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(tests/unit)

mapfile -t ignores < <(.venv/bin/python -m tests.support.torch_free)
listing=$(.venv/bin/python scripts/venvs.py others)
if [ -z "$listing" ]; then
    echo "no other supported Python found: the unit tests ran on Python 3.11 alone"
    exit 0
fi
if [ "$count" != all ]; then
    listing=$(head -n "$count" <<<"$listing")
fi
status=0
while read -r version venv; do
    echo "Python $version: ${paths[*]} (${#ignores[@]} modules that need torch left out)"
    code=0
    "$venv/bin/pytest" -q -p no:cacheprovider -m "not soak" "${paths[@]}" "${ignores[@]}" || code=$?
    if [ "$code" -eq 5 ]; then
        echo "no tests were collected on Python $version: that is a failure" >&2
        code=1
    fi
    [ "$code" -eq 0 ] || status=1
done <<<"$listing"
exit "$status"
