"""Containers for tests: a private registry and a test image built offline, for podman on
local nodes (orchestrator/providers/local/containers.py says how the nodes run it).

- **Registry: Debian's docker-registry** (distribution 2.8) with htpasswd auth (bcrypt, written
  with the venv's `bcrypt`), plain HTTP, listening on an address of this machine that the nodes
  reach: the nodes' bridge address (their gateway); the host pushes to the same address.
  `running_registry` starts and stops it; its storage is a directory of the test's. A
  listening socket on the bridge's address outlives the bridge's removal and works again once
  the bridge is back, so a registry may start before the first node. Its words, which the
  product turns into its messages: a wrong login is `Error: logging into "ADDR": invalid
  username/password`; a pull with a wrong password ends `unauthorized: authentication
  required`; a tag never pushed `manifest unknown`.
- **Image: mmdebstrap** (bookworm, `minbase` + `python3`, from the Debian mirror the machine
  reaches), with a marker file `MARKER` holding the image's key (the image is Debian 12 like
  the host, so /etc/os-release cannot tell them apart) and a `torchrun` that runs
  `python3 -m torch.distributed.run`. The rootfs tar is cached under
  `~/.cache/orch-test-images/<key>.tar` (the key: a digest of every input), then imported into
  a throwaway podman store and pushed (`push_image`). Torch comes the way the rest of the suite
  has it: the shared venv's site-packages (CPython 3.11 wheels, which the image's Debian
  python3.11 loads), bind-mounted read-only at its own path and put on PYTHONPATH
  (`torch_volume`), as a spec's `container.volumes` entry.

Measured here (2 loaded cores): the first build 43 s, a cached one 0.2 s; the rootfs tar
161 MiB, 56 MiB in the registry (one gzip layer); import and push 6.4 s; a pull to two nodes at
once about 7 s; a command in a container 0.27 s against 0.01 s bare.

The host is left as it was (`host_state`): the registry and the throwaway store live in
directories of the test's, mmdebstrap and the push run in mount namespaces of their own.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.providers.local.containers import (
    SYSTEM_STATE,
    podman_command,
    prepare_script,
    remove_leftover_cgroups,
)
from tests.support.waiting import wait_until

REGISTRY = "/usr/bin/docker-registry"
IMAGE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orch-test-images"
MARKER = "/etc/orch-test-image"  # the image's own file: a job that reads it runs in the image
SUITE = "bookworm"  # its python3 is 3.11, the suite's torch's ABI
PACKAGES = ("python3",)  # minbase has libstdc++6 and libgcc-s1, all torch's wheel needs
TORCHRUN = '#!/bin/sh\nexec python3 -m torch.distributed.run "$@"\n'
START_TIMEOUT_S = 30


def require_containers() -> None:
    """podman, crun, docker-registry and mmdebstrap are part of the tests' set-up."""
    assert os.path.isdir(SYSTEM_STATE), f"{SYSTEM_STATE} is missing: run `make setup-tests`"
    for program in ("podman", "runc", "tini", "conmon", REGISTRY, "mmdebstrap"):
        found = shutil.which(program) or shutil.which(program, path="/usr/libexec/podman")
        assert found, f"{program} is missing: run `make setup-tests` as root"


# --- registry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registry:
    """A running docker-registry with one user."""

    address: str  # "IP:PORT", plain HTTP
    user: str
    password: str
    root: Path  # its config, htpasswd, storage and log


def _htpasswd(user: str, password: str) -> str:
    import bcrypt  # the venv's; distribution's htpasswd takes bcrypt hashes only

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"


def _free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


def registry_config(root: Path, address: str) -> str:
    """docker-registry's config.yml (JSON is YAML): filesystem storage under `root`, HTTP on
    `address`, htpasswd auth."""
    config = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(root / "data")},
            "delete": {"enabled": True},
        },
        "http": {"addr": address, "secret": secrets.token_hex(16)},
        "auth": {"htpasswd": {"realm": "orch-test", "path": str(root / "htpasswd")}},
    }
    return json.dumps(config, indent=1)


def _v2_status(address: str, auth: tuple[str, str] | None = None) -> int | None:
    request = urllib.request.Request(f"http://{address}/v2/")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@contextlib.contextmanager
def running_registry(ip: str, storage: Path | None = None) -> Iterator[Registry]:
    """docker-registry on `ip` (an address of this machine the nodes reach) and a free port,
    with user `orch` and a random password; stopped and its directory removed afterwards.
    With `storage`, the images are kept there (made if absent, left afterwards): a later
    registry on it serves what an earlier one was pushed, whatever its address."""
    require_containers()
    root = Path(tempfile.mkdtemp(prefix="orchreg-", dir="/tmp"))
    if storage is not None:
        storage.mkdir(parents=True, exist_ok=True)
        (root / "data").symlink_to(storage.resolve())  # rmtree below removes the link alone
    user, password = "orch", secrets.token_urlsafe(12)
    address = f"{ip}:{_free_port(ip)}"
    (root / "htpasswd").write_text(_htpasswd(user, password))
    (root / "config.yml").write_text(registry_config(root, address))
    log = (root / "registry.log").open("w")
    proc = subprocess.Popen(
        [REGISTRY, "serve", str(root / "config.yml")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def answering() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"docker-registry exited:\n{(root / 'registry.log').read_text()}"
                )
            return _v2_status(address) == 401  # up, and asks for credentials

        wait_until(answering, "docker-registry's /v2/", START_TIMEOUT_S)
        yield Registry(address, user, password, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


# --- image --------------------------------------------------------------------------------------


def _mmdebstrap_version() -> str:
    out = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def image_key() -> str:
    """Digest of everything the test image is built from (suite, packages, files, tool)."""
    inputs = {
        "suite": SUITE, "packages": PACKAGES, "marker": MARKER, "torchrun": TORCHRUN,
        "tool": _mmdebstrap_version(), "argv": _mmdebstrap_argv("SUITE", Path("OUT"), "KEY"),
    }  # fmt: skip
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _mmdebstrap_argv(suite: str, out: Path, key: str) -> list[str]:
    torchrun = "/usr/local/bin/torchrun"
    return [
        "mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(PACKAGES)}",
        # no docs, man pages or translations: a smaller image, nothing a job reads
        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        f"--customize-hook=echo {shlex.quote(key)} > \"$1{MARKER}\"",
        f"--customize-hook=printf %s {shlex.quote(TORCHRUN)} > \"$1{torchrun}\" && "
        f"chmod 755 \"$1{torchrun}\"",
        suite, str(out),
    ]  # fmt: skip


@dataclass(frozen=True)
class OfflineImage:
    """The test image's rootfs, built or found in the cache."""

    key: str
    rootfs: Path  # a tar of the root file system
    built_s: float  # seconds this call spent building it (0.0 when cached)


def offline_image(cache: Path = IMAGE_CACHE) -> OfflineImage:
    """The test image's rootfs tar: `cache/<key>.tar`, built by mmdebstrap when absent (about
    a minute; in a private mount namespace, so that no mount of its chroot can stay behind)."""
    require_containers()
    key = image_key()
    rootfs = cache / f"{key}.tar"
    if rootfs.exists():
        return OfflineImage(key, rootfs, 0.0)
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f"{key}.{secrets.token_hex(4)}.partial.tar"
    started = time.monotonic()
    try:
        subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--",
             *_mmdebstrap_argv(SUITE, partial, key)],
            check=True, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        partial.replace(rootfs)  # atomic: a reader sees a whole tar or none
    finally:
        partial.unlink(missing_ok=True)
    return OfflineImage(key, rootfs, time.monotonic() - started)


# --- podman ---------------------------------------------------------------------------------


def push_image(image: OfflineImage, registry: Registry, repository: str) -> str:
    """Import `image` into a throwaway podman store and push it to `registry` as
    `repository:<key>`; returns the reference the nodes pull. The store is removed after."""
    ref = f"{registry.address}/{repository}:{image.key}"
    # short: podman refuses a runroot of over 50 characters
    base = tempfile.mkdtemp(prefix="orchpm-", dir="/tmp")
    podman = podman_command(base).replace("--storage-driver overlay", "--storage-driver vfs")
    script = (
        f"{prepare_script(Path('/proc/self/mounts').read_text(), base)} && "
        f"{podman} login --tls-verify=false --password-stdin -u {registry.user} "
        f"{registry.address} && "
        f"{podman} import --change 'CMD [\"/bin/sh\"]' {image.rootfs} {ref} >/dev/null && "
        f"{podman} push --tls-verify=false --quiet {ref}; rc=$?; "
        f"{podman} system reset --force; exit $rc"
    )
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        input=registry.password, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    shutil.rmtree(base, ignore_errors=True)
    remove_leftover_cgroups()
    assert out.returncode == 0, f"push of {ref} failed:\n{out.stdout}\n{out.stderr}"
    return ref


def torch_volume() -> tuple[str, str]:
    """The `--volume` option and PYTHONPATH that give a container this suite's torch: the
    shared venv's site-packages, read-only, at its own path."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is not in this venv"
    site = str(Path(spec.origin).resolve().parents[1])
    return f"{site}:{site}:ro", site


def host_state() -> dict[str, str]:
    """What podman could leave on the host: mounts, cgroup directories, files in its system
    state directory, and what a container on podman's default (bridge) network would leave:
    CNI's firewall rules, its cni-podman0 bridge, /var/lib/cni. orch's own bridge rules are
    left out of the comparison: local nodes of tests running beside this one add and remove
    theirs meanwhile."""
    cgroups = subprocess.run(
        ["find", "/sys/fs/cgroup", "-maxdepth", "3", "-type", "d", "-name", "*libpod*"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if "containers" in line or "overlay" in line]  # fmt: skip
    forward = subprocess.run(["iptables-nft", "-S"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    return {
        "cgroups": cgroups,
        "mounts": "\n".join(mounts),
        "firewall": "\n".join(r for r in forward.splitlines() if "orch-bridge:" not in r),
        "cni": f"{'cni-podman' in links} {os.path.exists('/var/lib/cni')}",
        SYSTEM_STATE: " ".join(sorted(os.listdir(SYSTEM_STATE))),  # root's podman's own
    }
