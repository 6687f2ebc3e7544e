#!/usr/bin/env bash
# Idempotent set-up: system tools, a venv keyed by the dependency pins, the project in it.
#
# The venv lives outside the clone (ORCH_VENV_CACHE, default ~/.cache/orch-venv/<hash>) so that
# every clone with the same pins (CI's fresh clones included) reuses it; `.venv` links to it.
set -euo pipefail

cd "$(dirname "$0")/.."
root_dir=$(pwd)

# --- system tools -----------------------------------------------------------------------
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "orch needs these system packages: ${missing[*]}" >&2
        echo "install them as root (apt-get install -y ${missing[*]}) and run 'make setup' again" >&2
        exit 1
    fi
    echo "installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- python -----------------------------------------------------------------------------
python_bin=""
for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        python_bin=$(command -v "$candidate")
        break
    fi
done
if [ -z "$python_bin" ]; then
    echo "orch needs Python 3.11 (python3.11 or python3 on the PATH)" >&2
    exit 1
fi

pins_hash=$("$python_bin" - <<'PY'
import hashlib, json, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
pins = {"python": sys.version.split()[0], "deps": sorted(project["dependencies"]),
        "extras": {k: sorted(v) for k, v in sorted(project["optional-dependencies"].items())}}
print(hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:16])
PY
)
venv_dir="${ORCH_VENV_CACHE:-$HOME/.cache/orch-venv}/$pins_hash"

if [ ! -f "$venv_dir/.complete" ]; then
    echo "building the venv in $venv_dir (torch takes a few minutes the first time)"
    rm -rf "$venv_dir"
    mkdir -p "$(dirname "$venv_dir")"
    "$python_bin" -m venv "$venv_dir"
    "$venv_dir/bin/pip" install -q --upgrade "pip>=24" "setuptools>=68" wheel
    deps=$("$python_bin" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["trainer"] + extras["dev"]))
PY
)
    mapfile -t dep_list <<<"$deps"
    "$venv_dir/bin/pip" install -q "${dep_list[@]}"
    touch "$venv_dir/.complete"
fi

# The project itself: an editable install pointing at this clone (cheap; redone when the
# clone that last used this venv was another one, when pyproject.toml changed (entry points,
# package data), or when the entry point is missing).
project_key="$root_dir $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$venv_dir/.project-path" 2>/dev/null)" != "$project_key" ] || [ ! -x "$venv_dir/bin/orch" ]; then
    "$venv_dir/bin/pip" install -q --no-deps --no-build-isolation -e "$root_dir"
    echo "$project_key" >"$venv_dir/.project-path"
fi

ln -sfn "$venv_dir" .venv
echo "setup done: .venv -> $venv_dir"
