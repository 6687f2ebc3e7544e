"""A real Docker daemon (Debian's docker.io) started by a test, and the machine put back after.

The daemon runs in a network namespace that stands in for the host (`netns_host`): there it
does what it does at every boot of a machine with Docker — loads br_netfilter, sets
`net.bridge.bridge-nf-call-iptables=1`, turns on IP forwarding, sets iptables' FORWARD policy
to DROP and makes its chains (DOCKER-USER first) and its docker0 bridge — while the real host's
firewall, and the local nodes of tests running beside this one, stay as they are. Its state lives
in a directory of the test's own; what it writes outside it (its trust key in /etc/docker,
containerd's /opt/containerd, /run/docker) is removed when it did not exist before, and a
br_netfilter module it loaded is unloaded. `host_state` is what the test compares before and
after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns_host import kill_in_netns, nsenter_argv, sh
from tests.support.waiting import wait_until

# What the daemon (20.10) and its containerd write outside their roots, on first start.
OUTSIDE = ("/etc/docker/key.json", "/opt/containerd", "/run/docker", "/run/containerd")
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class Dockerd:
    ns: str
    root: Path  # data root, exec root, socket, log
    iptables: str  # `iptables -S` in its namespace once it started


def _listing(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    return f"{out.returncode}\n{out.stdout}"


def _modules() -> str:
    try:
        return " ".join(line.split()[0] for line in Path("/proc/modules").read_text().splitlines())
    except OSError:  # a kernel without loadable modules (br_netfilter built in)
        return ""


def _docker_links() -> list[str]:
    # Only Docker's: other tests make and remove their nodes' veths meanwhile.
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    names = (line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line)
    return [name for name in names if name.startswith(("docker", "br-"))]


def host_state() -> dict[str, str]:
    """What Docker's daemon would change on the host: the firewall as every program here sees
    it, br_netfilter (module and sysctl), IP forwarding, the interfaces, the daemon's files
    outside its roots, and running dockerd/containerd processes."""
    state = {
        "iptables-nft": _listing(["iptables-nft", "-S"]),
        "nft": _listing(["nft", "list", "ruleset"]),
        "modules": _modules(),
        "docker links": " ".join(sorted(_docker_links())),
        "processes": _listing(["pgrep", "-a", "-x", "dockerd|containerd"]),
    }
    if "filter" in Path("/proc/net/ip_tables_names").read_text().split():
        state["iptables-legacy"] = _listing(["iptables-legacy", "-S"])  # listing creates none
    for sysctl in ("net/bridge/bridge-nf-call-iptables", "net/ipv4/ip_forward"):
        path = Path("/proc/sys") / sysctl
        state[sysctl] = path.read_text().strip() if path.exists() else "(absent)"
    for path in OUTSIDE:
        state[path] = "present" if os.path.lexists(path) else "absent"
    return state


def require_docker() -> None:
    """dockerd, containerd and iptables are part of this machine's set-up (scripts/setup.sh)."""
    for program in ("dockerd", "containerd", "iptables-nft", "nsenter"):
        assert shutil.which(program), f"{program} is missing: run `make setup` as root"


@contextlib.contextmanager
def running_dockerd(ns: str) -> Iterator[Dockerd]:
    """Start Docker's daemon in network namespace `ns` and wait until it has set up its
    firewall; stop it and remove what it left outside its roots afterwards."""
    require_docker()
    before = {path: os.path.lexists(path) for path in OUTSIDE}
    modules = _modules()
    # short: containerd's socket path under the exec root must fit a unix socket's 108 bytes
    root = Path(tempfile.mkdtemp(prefix="orchdk-", dir="/tmp"))
    # A host that does not forward yet, whatever this machine does (a new namespace takes its
    # value): dockerd sets FORWARD's policy to DROP when it is the one that turns forwarding on.
    sh(ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=0")
    log = (root / "dockerd.log").open("w")
    argv = [
        *nsenter_argv(ns), "dockerd", "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"), "--pidfile", str(root / "dockerd.pid"),
        "--host", f"unix://{root}/docker.sock", "--storage-driver", "vfs",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:

        def listening() -> bool:
            said = (root / "dockerd.log").read_text(errors="replace")
            if "API listen on" in said:
                return True
            if proc.poll() is not None:
                raise AssertionError(f"dockerd did not start:\n{said}")
            return False

        wait_until(
            listening, "dockerd's API", START_TIMEOUT_S,
            fail=lambda said: AssertionError(
                f"{said}\n{(root / 'dockerd.log').read_text(errors='replace')}"
            ),
        )  # fmt: skip
        yield Dockerd(ns, root, sh(ns, "iptables-nft", "-S").stdout)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kill_in_netns(ns)  # its containerd, should it outlive it
        log.close()
        _put_back(before, modules)
        shutil.rmtree(root, ignore_errors=True)


def _put_back(before: dict[str, bool], modules: str) -> None:
    for path, existed in before.items():
        if existed or not os.path.lexists(path):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    if "br_netfilter" in _modules().split() and "br_netfilter" not in modules.split():
        subprocess.run(["modprobe", "-r", "br_netfilter"], check=False, capture_output=True)
