"""How local nodes run a job's container image: podman, rootful and daemonless, in the node.

Only namespace-mode nodes run containers (a loopback node shares this machine's network and
files, so a container there would not be the node's). In each such node podman keeps
everything under the node's HOME (its own image store, so a kept node keeps its images and a
new node pulls), runs containers on the node's network (`--network host`: the node's address
and peers, never podman's bridge network, which would change this machine's firewall), and
starts no daemon: its monitor (conmon) and the containers are processes of the node's network
namespace, which `terminate` kills with the rest of the node.

What this machine needs (Debian: `apt-get install podman runc tini`), and why the options:

- a namespace node's /sys is a fresh sysfs without cgroups: `prepare` mounts this machine's
  cgroup hierarchies there, in the node's mount namespace (`cgroup_mounts`), and podman uses
  its cgroupfs manager (no systemd in a node); `remove_leftover_cgroups` removes the empty
  `libpod_parent` cgroups it leaves on this machine once the node is gone;
- root's podman writes a blob cache under /var/lib/containers whatever its options say:
  `prepare` mounts a directory of the node's own over it, in the node's mount namespace;
- runc rather than crun where it is installed (crun 1.8 refuses hybrid cgroup layouts), and an
  init (catatonit or tini) as the container's first process, which hands TERM to the job.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

from orchestrator.node.container import ContainerRuntime
from orchestrator.providers.local.net import NODE_HOME

BASE = f"{NODE_HOME}/.orch-containers"  # podman's files on a node; its runroot must be short
SYSTEM_STATE = "/var/lib/containers"
INIT_CANDIDATES = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/bin/tini")
CGROUP_ROOT = Path("/sys/fs/cgroup")
INSTALL_HINT = "apt-get install podman runc tini"


def podman_command(base: str = BASE, runroot: str | None = None) -> str:
    """podman with its global options: storage and temporary files under `base` (shell text:
    it may name a variable), runtime state under `runroot` (default `base`/run; podman wants
    it at most 50 characters long)."""
    return (
        f"TMPDIR={base}/tmp podman --root {base}/storage --runroot {runroot or base + '/run'} "
        f"--tmpdir {base}/libpod --storage-driver overlay --cgroup-manager cgroupfs "
        "--events-backend file"
    )


def cgroup_mounts(mounts: str) -> str:
    """Shell text that mounts this machine's cgroup hierarchies at their places in a node's
    mount namespace, unless they are there already. `mounts` is /proc/self/mounts' text.

    Mounting a hierarchy with the options it has here attaches the same hierarchy; the tmpfs
    under them and the mounts live and die with the node's mount namespace.
    """
    steps = ["mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup"]
    first = ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        _source, where, kind, options = fields[:4]
        if kind not in ("cgroup", "cgroup2") or not where.startswith("/sys/fs/cgroup/"):
            continue
        first = first or where
        own = ",".join(o for o in options.split(",") if o not in ("rw", "relatime")) or "rw"
        steps.append(f"mkdir -p {shlex.quote(where)}")
        steps.append(f"mount -t {kind} -o {shlex.quote(own)} {kind} {shlex.quote(where)}")
    if not first:
        return "true"
    return f"grep -q ' {first} ' /proc/self/mounts || {{ {' && '.join(steps)}; }}"


def prepare_script(mounts: str, base: str = BASE, runroot: str | None = None) -> str:
    """Shell text a node runs (as root, in its own mount namespace) before its first pull:
    podman is there, its directories are made, the cgroups and the blob cache's directory are
    mounted; with `runroot` (a short path of its own, see `podman_command`), a tmpfs is
    mounted there, so each node's runtime state is its own. Idempotent."""
    missing = (
        f"echo 'podman is not installed on this machine, which runs the local nodes: "
        f"{INSTALL_HINT}'; exit 1"
    )
    return " && ".join(
        [
            f"{{ command -v podman >/dev/null || {{ {missing}; }}; }}",
            f"mkdir -p {base}/tmp {base}/libpod {base}/state {base}/storage",
            f"chmod 700 {base}",
            cgroup_mounts(mounts),
            f"mkdir -p {SYSTEM_STATE}",
            f"{{ grep -q ' {SYSTEM_STATE} ' /proc/self/mounts || "
            f"mount --bind {base}/state {SYSTEM_STATE}; }}",
        ]
        + ([] if runroot is None else [private_tmpfs(runroot)])
    )


def private_tmpfs(path: str) -> str:
    """Shell text that mounts a tmpfs on `path` (made if missing) unless one is mounted there
    already, in the mount namespace that runs it."""
    return (
        f"mkdir -p {path} && {{ grep -q ' {path} ' /proc/self/mounts || "
        f"mount -t tmpfs -o mode=700 tmpfs {path}; }}"
    )


def local_runtime(
    insecure_registries: Sequence[str] = (), *, base: str = BASE, runroot: str | None = None
) -> ContainerRuntime:
    """The runtime of this machine's namespace nodes (reads which OCI runtime and init are
    installed, and this machine's cgroup mounts); `base` and `runroot` as `podman_command`
    takes them (a machine of another layout: the sandbox's hosts)."""
    options: list[str] = []
    if shutil.which("runc"):
        options += ["--runtime", "runc"]
    init = next((p for p in INIT_CANDIDATES if os.access(p, os.X_OK)), None)
    if init is not None:
        options += ["--init-path", init]
    mounts = ""
    with contextlib.suppress(OSError):
        mounts = Path("/proc/self/mounts").read_text()
    return ContainerRuntime(
        kind="podman",
        command=podman_command(base, runroot),
        prepare=prepare_script(mounts, base, runroot),
        run_options=tuple(options),
        insecure_registries=tuple(insecure_registries),
    )


def remove_leftover_cgroups(root: Path = CGROUP_ROOT) -> None:
    """Remove the empty cgroups podman's cgroupfs manager made on this machine
    (`libpod_parent` in each hierarchy), deepest first. A cgroup that still holds a process
    (another node's container) cannot be removed, and stays."""
    with contextlib.suppress(OSError):
        for hierarchy in root.iterdir():
            parent = hierarchy / "libpod_parent"
            if not parent.is_dir() or parent.is_symlink():
                continue
            for here, dirs, _files in os.walk(parent, topdown=False):
                for name in dirs:
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(here, name))
            with contextlib.suppress(OSError):
                parent.rmdir()
