#!/usr/bin/env bash
# Idempotent set-up: system tools, then this clone's venv, linked as `.venv`.
# `--tests` (`make test`, `make soak`) also installs what only the tests use: the firewall
# programs and Docker's daemon.
#
# The venvs live outside the clone (ORCH_VENV_CACHE, default ~/.cache/orch-venv): the
# dependencies in one keyed by the Python and the pins, which every clone with the same pins (CI's
# fresh clones included) reuses, and this clone's orch in one of its own layered on it.
set -euo pipefail

cd "$(dirname "$0")/.."

# --- system tools -----------------------------------------------------------------------
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
# PostgreSQL's server (initdb, pg_ctl): the tests run the ledger on a real one too
compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || missing+=(postgresql)
# The firewall programs and Docker's daemon, for the tests only: they show that local nodes
# work beside a firewall that drops forwarded traffic, Docker's included (each in a network
# namespace of its own; the daemon is never started as the machine's service)
if [ "${1:-}" = --tests ]; then
    has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
    has iptables-legacy || missing+=(iptables)
    has nft || missing+=(nftables)
    has dockerd || missing+=(docker.io)
    # A container runtime for the nodes, a registry and a root file system builder: the
    # container tests pull an image built offline from Debian's packages (tests/support/containers.py)
    has podman || missing+=(podman)
    has runc || missing+=(runc)
    has tini || missing+=(tini)  # the containers' first process, which hands them TERM
    has docker-registry || missing+=(docker-registry)
    has mmdebstrap || missing+=(mmdebstrap)
    # A headless browser and its driver: the dashboard's tests load its pages as a user does
    # (tests/support/browser.py starts Debian's program and driver by these paths)
    [ -x /usr/lib/chromium/chromium ] || missing+=(chromium)
    [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "orch needs these system packages: ${missing[*]}" >&2
        echo "install them as root (apt-get install -y ${missing[*]}) and run 'make setup' again" >&2
        exit 1
    fi
    echo "installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # No service starts at install (docker.io's would set the host's FORWARD policy to DROP):
    # a policy-rc.d that refuses, unless the machine has one already.
    policy=/usr/sbin/policy-rc.d
    made_policy=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    installed=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || installed=$?
    [ -z "$made_policy" ] || rm -f "$policy"
    [ "$installed" -eq 0 ] || exit "$installed"
fi
# root's podman keeps a blob cache here whatever its options say; the tests mount a directory
# of their own over it, so the host's stays empty
if [ "${1:-}" = --tests ] && [ "$(id -u)" -eq 0 ]; then
    mkdir -p /var/lib/containers
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

# The heavy dependencies (torch) go in a venv shared by every clone with the same pins; orch
# itself in a thin venv of this clone's own over it, so that setup here never re-points another
# clone's `.venv` (scripts/venvs.py says how).
venv_dir=$("$python_bin" scripts/venvs.py main)
ln -sfn "$venv_dir" .venv
echo "setup done: .venv -> $venv_dir"
