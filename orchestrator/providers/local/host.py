"""What the local provider asks of this host: commands, namespaces, and a node's processes.

Every process of a local node is found, so that terminating a node ends it all:
- every session process carries `ORCH_LOCAL_NODE=<id>` in its environment (sshd's `SetEnv`), so
  even a `setsid`/`nohup` trainer that left sshd's process group is found by its environment
  (read through psutil);
- sshd processes overwrite their environment with their title and call setsid per connection;
  in namespace mode `ip netns pids` lists them (and everything else inside the node's network
  namespace), on loopback they are the sshd processes holding sockets on the node's own port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable

import psutil

from orchestrator.errors import ProviderError
from orchestrator.providers.local.net import (
    NETNS_PREFIX,
    NODE_MARKER,
    netns_addrs_argv,
    netns_pids_argv,
    parse_addr_json,
)
from orchestrator.providers.ssh_banner import answers_ssh as answers_ssh  # re-exported


def pids_with_env(name: str, value: str) -> set[int]:
    """Pids of live processes whose environment holds `name=value` (exactly that value)."""
    found: set[int] = set()
    for process in psutil.process_iter():
        try:
            environ = process.environ()
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            continue
        if environ.get(name) == value:
            found.add(process.pid)
    return found


def pids_with_marker(instance_id: str) -> set[int]:
    """Pids of live processes whose environment holds `ORCH_LOCAL_NODE=<instance_id>`."""
    return pids_with_env(NODE_MARKER, instance_id)


def sshd_pids_on_port(port: int) -> set[int]:
    """Pids of live sshd processes holding a TCP socket whose local port is `port`.

    On loopback every node's sshd has a port of its own; its listener and each per-connection
    process (which calls setsid and overwrites its environment with its title) hold sockets on
    that port, so this finds them where neither the marker nor the process group would.
    """
    found: set[int] = set()
    for process in psutil.process_iter():
        # One process at a time: psutil's machine-wide listing names one holder per socket,
        # and a socket may have several.
        if not pid_runs(process.pid, "sshd"):
            continue
        try:
            sockets = process.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            continue
        if any(s.laddr and s.laddr.port == port for s in sockets):
            found.add(process.pid)
    return found


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (whatever it runs)."""
    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def pid_runs(pid: int, needle: str) -> bool:
    """Whether process `pid` is alive (not a zombie) and its command line contains `needle`."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            cmdline = " ".join(process.cmdline())
            alive = process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False
    return alive and needle in cmdline


def netns_pids(instance_id: str) -> set[int]:
    """Pids of the processes in a node's network namespace (empty if the namespace is gone)."""
    # Run from inside the namespace (a node powering itself off), `ip` lists itself: not ours.
    with subprocess.Popen(
        netns_pids_argv(instance_id), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as lister:
        stdout, _ = lister.communicate()
    if lister.returncode != 0:
        return set()
    return {int(tok) for tok in stdout.split() if tok.isdigit()} - {lister.pid}


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each pid; vanished pids are fine."""
    for pid in pids:
        if pid == os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def sweep(find: Callable[[], set[int]], *, timeout: float = 10.0) -> bool:
    """Kill what `find` returns until it returns nothing; False if processes outlived `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        pids = find()
        pids.discard(os.getpid())
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        kill_all(pids)
        time.sleep(0.02)


def run_checked(argv: list[str], *, hint: str | None = None) -> str:
    """Run a system command; raise `ProviderError` with its stderr when it fails."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ProviderError(f"cannot run {argv[0]}: {exc}") from exc
    if out.returncode != 0:
        raise ProviderError(
            f"`{' '.join(argv)}` failed ({out.returncode}): {out.stderr.strip()}", hint=hint
        )
    return out.stdout


def orch_namespaces() -> list[str]:
    """Names of every `orch-*` network namespace of this host (any ORCH_HOME, any bridge)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    names = (line.split()[0] for line in listing.stdout.splitlines() if line.strip())
    return [name for name in names if name.startswith(NETNS_PREFIX)]


def live_namespace_ips() -> set[str]:
    """IPv4 addresses inside every `orch-*` network namespace of this host."""
    ips: set[str] = set()
    for ns in orch_namespaces():
        out = subprocess.run(netns_addrs_argv(ns), capture_output=True, text=True, check=False)
        ips |= parse_addr_json(out.stdout)
    return ips
