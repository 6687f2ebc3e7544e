"""Containers for tests: a private registry, a test image built offline, podman on a local node.

What works here (Debian 12, root without CAP_SYS_RESOURCE, no systemd, cgroup v1 hybrid), and
how; `tests/integration/test_container_smoke.py` shows all of it on a real namespace node:

- **Runtime: Debian's podman 4.3, rootful, daemonless**, with runc and conmon. It runs in a
  node's sessions as any node command does (over the node's sshd, so in the node's network,
  mount and UTS namespaces); `--network host` then gives the container the node's own network:
  its address, its peers, its port 22. Never run a container without it: podman's default
  bridge network (CNI) makes `cni-podman0`, CNI-FORWARD rules in the host's firewall,
  /var/lib/cni and turns on ip_forward. `NodePodman` holds the settings:
  - every path under the node's HOME (private to the node, so each node has its own image
    store and a pull is a real pull): `--root`, `--runroot` (at most 50 characters),
    `--tmpdir`, TMPDIR, a `registries.conf` that marks the test registry's address (and only
    it) insecure, an auth file (`REGISTRY_AUTH_FILE`, 0600: `podman login --password-stdin`
    writes it, or `auth_file` from standard input; a password never on a command line);
  - root's podman writes a blob cache to /var/lib/containers/cache whatever its options say:
    `setup` mounts a directory of the node's own over `SYSTEM_STATE` in the node's mount
    namespace (the host keeps an empty directory, made by `make setup-tests`);
  - a namespace node's /sys is a fresh sysfs with no cgroup under it: `setup` mounts the host's
    cgroup hierarchies there (`cgroup_mounts`); `--cgroup-manager cgroupfs` (no systemd), and
    `teardown` removes the `libpod_parent` cgroups it leaves, when empty;
  - `--storage-driver overlay` (the node's disk is an ext4 directory; overlay mounts stay in the
    node's mount namespace and go with it), `--events-backend file`;
  - on `run`: `--runtime runc` (crun 1.8 refuses this machine's hybrid cgroups: "cgroups in
    hybrid mode not supported, drop all controllers from cgroupv2"; `--cgroups disabled`
    needs crun) and explicit ulimits (podman's defaults, nofile 1048576 and nproc 4194304, are
    above this machine's hard limits and root here may not raise them: "setrlimit
    RLIMIT_NOFILE: Operation not permitted").
- **Registry: Debian's docker-registry** (distribution 2.8) with htpasswd auth (bcrypt, written
  with the venv's `bcrypt`), plain HTTP, listening on an address of this machine that the nodes
  reach: the address of the test's own local bridge (the subnet's first address, the nodes'
  gateway); the host pushes to the same address. `running_registry` starts and stops it; its
  storage is a directory of the test's. The runtime's words, which the product will turn into
  its message: a wrong login is `Error: logging into "ADDR": invalid username/password`; a pull
  with a wrong password ends `unauthorized: authentication required`.
- **Image: mmdebstrap** (bookworm, `minbase` + `python3`, from the Debian mirror the machine
  reaches), with a marker file `MARKER` holding the image's key (the image is Debian 12 like
  the host, so /etc/os-release cannot tell them apart) and a `torchrun` that runs
  `python3 -m torch.distributed.run`. The rootfs tar is cached under
  `~/.cache/orch-test-images/<key>.tar` (the key: a digest of every input), then imported into
  a throwaway podman store and pushed (`push_image`). Torch comes the way the rest of the suite
  has it: the shared venv's site-packages (CPython 3.11 wheels, which the image's Debian
  python3.11 loads), bind-mounted read-only at its own path and put on PYTHONPATH
  (`torch_volume`), as the spec's `volumes` option would.

Measured here (2 loaded cores): the first build 43 s, a cached one 0.2 s; the rootfs tar
161 MiB, 56 MiB in the registry (one gzip layer); import and push 6.4 s; a pull to one node
5-6 s, to two nodes at once 7.2 s; a command in a container 0.27 s against 0.01 s bare; a
2-node x 2-process gloo torchrun across two nodes' containers works (8 s); the smoke test
about 22 s.

The host is left as it was: the registry and the throwaway store live in directories of the
test's, mmdebstrap and the push run in mount namespaces of their own, podman on a node keeps
everything under the node's HOME and starts no daemon (its conmon and containers are
processes of the node's network namespace, which terminating a node kills).
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

from tests.support.waiting import wait_until

REGISTRY = "/usr/bin/docker-registry"
IMAGE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orch-test-images"
MARKER = "/etc/orch-test-image"  # the image's own file: a job that reads it runs in the image
SUITE = "bookworm"  # its python3 is 3.11, the suite's torch's ABI
PACKAGES = ("python3",)  # minbase has libstdc++6 and libgcc-s1, all torch's wheel needs
TORCHRUN = '#!/bin/sh\nexec python3 -m torch.distributed.run "$@"\n'
START_TIMEOUT_S = 30
# Root's podman writes its blob cache (blob-info-cache-v1.boltdb) here, with no option to move
# it; `scripts/setup.sh --tests` makes the (empty) directory, and every podman of the tests runs
# in a mount namespace where a directory of its own is mounted over it.
SYSTEM_STATE = "/var/lib/containers"


def require_containers() -> None:
    """podman, crun, docker-registry and mmdebstrap are part of the tests' set-up."""
    assert os.path.isdir(SYSTEM_STATE), f"{SYSTEM_STATE} is missing: run `make setup-tests`"
    for program in ("podman", "runc", "conmon", REGISTRY, "mmdebstrap"):
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
def running_registry(ip: str) -> Iterator[Registry]:
    """docker-registry on `ip` (an address of this machine the nodes reach) and a free port,
    with user `orch` and a random password; stopped and its directory removed afterwards."""
    require_containers()
    root = Path(tempfile.mkdtemp(prefix="orchreg-", dir="/tmp"))
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


# --- podman -------------------------------------------------------------------------------------


def registries_conf(address: str) -> str:
    """registries.conf that lets podman speak plain HTTP to `address`, and to nothing else;
    short names are never resolved against a search list."""
    return (
        'unqualified-search-registries = []\nshort-name-mode = "enforcing"\n\n'
        f'[[registry]]\nlocation = "{address}"\ninsecure = true\n'
    )


@dataclass(frozen=True)
class NodePodman:
    """podman's settings on one node: everything under `base` (in the node's HOME)."""

    base: str  # e.g. "$HOME/.containers" as the node's shell expands it, or a host path
    storage_driver: str = "overlay"

    def env(self) -> str:
        """Shell assignments (for a command line prefix) naming its registries.conf and auth
        file."""
        return (
            f'CONTAINERS_REGISTRIES_CONF="{self.base}/registries.conf" '
            f'REGISTRY_AUTH_FILE="{self.base}/auth.json" TMPDIR="{self.base}/tmp"'
        )

    def podman(self) -> str:
        """`podman` with its global options, as shell text (the base left to the shell)."""
        return (
            f'{self.env()} podman --root "{self.base}/storage" --runroot "{self.base}/run" '
            f'--tmpdir "{self.base}/libpod" --storage-driver {self.storage_driver} '
            "--cgroup-manager cgroupfs --events-backend file"
        )

    def setup(self, registry: str) -> str:
        """Shell text that makes its directories, writes registries.conf for `registry`, and,
        in the mount namespace it runs in (a node's, or one of the caller's own), mounts the
        cgroups (`cgroup_mounts`) and its own `state` directory over `SYSTEM_STATE`: root's
        podman keeps a blob cache there whatever its options say."""
        return (
            f"{cgroup_mounts()} && "
            f'mkdir -p "{self.base}/tmp" "{self.base}/libpod" "{self.base}/state" && '
            f'chmod 700 "{self.base}" && {{ mountpoint -q {SYSTEM_STATE} || '
            f'mount --bind "{self.base}/state" {SYSTEM_STATE}; }} && '
            f'printf %s {shlex.quote(registries_conf(registry))} > "{self.base}/registries.conf"'
        )

    def login(self, registry: str, user: str) -> str:
        """Log in to `registry` as `user`, the password read from standard input."""
        return f"{self.podman()} login --password-stdin -u {shlex.quote(user)} {registry}"

    def auth_file(self) -> str:
        """Shell text that writes its auth file (0600) from standard input: a docker
        config.json `{"auths": {...}}`, as `podman login` writes it."""
        return f'umask 077 && cat > "{self.base}/auth.json"'

    def run(self, image: str, command: str, *options: str) -> str:
        """Run `command` (shell text, run by the image's /bin/sh) in a new container of
        `image` on the node's network; removed when it ends.

        `--runtime runc`: crun refuses this machine's hybrid cgroup layout ("cgroups in hybrid
        mode not supported"). The explicit ulimits: without CAP_SYS_RESOURCE the runtime may
        not raise a limit, and podman's defaults (nofile 1048576, nproc 4194304) are above
        this machine's hard limits; the node's own hard limits are passed (nproc capped at
        pid_max, to which podman lowers conmon's).
        """
        opts = " ".join(shlex.quote(o) for o in options)
        return (
            "nf=$(ulimit -Hn); np=$(ulimit -Hu); pm=$(cat /proc/sys/kernel/pid_max); "
            '{ [ "$np" = unlimited ] || [ "$pm" -lt "$np" ]; } && np=$pm; '
            f"{self.podman()} run --rm --network host --runtime runc "
            '--ulimit "nofile=$nf:$nf" --ulimit "nproc=$np:$np" '
            f"{opts} {shlex.quote(image)} sh -c {shlex.quote(command)}"
        )

    def teardown(self) -> str:
        """Remove every container and image and the storage (unmounting its layers), then the
        cgroups podman's cgroupfs manager leaves (`libpod_parent`, `conmon`) where they are
        empty: rmdir never removes a cgroup that still holds a process."""
        return (
            f'{self.podman()} system reset --force; rm -rf "{self.base}"; '
            "find /sys/fs/cgroup -depth -type d -path '*/libpod_parent*' "
            "-exec rmdir {} \\; 2>/dev/null; true"
        )


def auth_json(registry: str, user: str, password: str) -> str:
    """A docker config.json holding `user`:`password` for `registry`."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {registry: {"auth": token}}})


def cgroup_mounts(mounts: str | None = None) -> str:
    """Shell text that mounts, in a node's mount namespace, the host's cgroup hierarchies at
    the host's places, unless they are there already.

    A namespace node's /sys is a fresh sysfs (`ip netns exec` mounts one for the namespace), so
    its /sys/fs/cgroup is empty and podman's cgroupfs manager finds no cgroup ("no cgroup
    mount found in mountinfo"). Mounting a v1 hierarchy with the options it has on the host
    (from `mounts`, /proc/self/mounts' text) attaches the same hierarchy; the tmpfs under them
    and the mounts live and die with the node's mount namespace.
    """
    lines = (mounts or Path("/proc/self/mounts").read_text()).splitlines()
    steps = ["mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup"]
    first = ""
    for line in lines:
        _source, where, kind, options, *_ = line.split()
        if kind not in ("cgroup", "cgroup2") or not where.startswith("/sys/fs/cgroup/"):
            continue
        first = first or where
        own = ",".join(o for o in options.split(",") if o not in ("rw", "relatime")) or "rw"
        steps.append(f"mkdir -p {shlex.quote(where)}")
        steps.append(f"mount -t {kind} -o {shlex.quote(own)} {kind} {shlex.quote(where)}")
    if not first:
        return "true"
    return f"grep -q ' {first} ' /proc/self/mounts || {{ {' && '.join(steps)}; }}"


def push_image(image: OfflineImage, registry: Registry, repository: str) -> str:
    """Import `image` into a throwaway podman store and push it to `registry` as
    `repository:<key>`; returns the reference the nodes pull. The store is removed after."""
    ref = f"{registry.address}/{repository}:{image.key}"
    # short: podman refuses a runroot of over 50 characters
    host = NodePodman(tempfile.mkdtemp(prefix="orchpm-", dir="/tmp"), storage_driver="vfs")
    script = (
        f"{host.setup(registry.address)} && "
        f"{host.login(registry.address, registry.user)} && "
        f"{host.podman()} import --change 'CMD [\"/bin/sh\"]' {image.rootfs} {ref} >/dev/null && "
        f"{host.podman()} push --quiet {ref}; rc=$?; {host.teardown()}; exit $rc"
    )
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        input=registry.password, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    shutil.rmtree(host.base, ignore_errors=True)
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
