"""What the local provider asks of this host: commands, namespaces, and a node's processes.

Every process of a local node is found, so that terminating a node ends it all:
- every session process carries `ORCH_LOCAL_NODE=<id>` in its environment (sshd's `SetEnv`), so
  even a `setsid`/`nohup` trainer that left sshd's process group is found by reading
  `/proc/<pid>/environ`;
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
from pathlib import Path

from orchestrator.errors import ProviderError
from orchestrator.providers.local.net import (
    NETNS_PREFIX,
    NODE_MARKER,
    netns_addrs_argv,
    netns_pids_argv,
    parse_addr_json,
)
from orchestrator.providers.ssh_banner import answers_ssh as answers_ssh  # re-exported

PROC = Path("/proc")


def pids_with_marker(instance_id: str, proc: Path = PROC) -> set[int]:
    """Pids of live processes whose environment holds `ORCH_LOCAL_NODE=<instance_id>`."""
    wanted = f"{NODE_MARKER}={instance_id}".encode()
    found: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, a zombie, or not ours to read
            continue
        if wanted in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def sshd_pids_on_port(port: int, proc: Path = PROC) -> set[int]:
    """Pids of live sshd processes holding a TCP socket whose local port is `port`.

    On loopback every node's sshd has a port of its own; its listener and each per-connection
    process (which calls setsid and overwrites its environment with its title) hold sockets on
    that port, so this finds them where neither the marker nor the process group would.
    """
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    wanted = {f"socket:[{inode}]" for inode in inodes if inode != "0"}
    found: set[int] = set()
    if not wanted:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if links & wanted and pid_runs(int(entry.name), "sshd", proc):
            found.add(int(entry.name))
    return found


def pid_alive(pid: int, proc: Path = PROC) -> bool:
    """Whether process `pid` exists and is not a zombie (whatever it runs)."""
    try:
        state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def pid_runs(pid: int, needle: str, proc: Path = PROC) -> bool:
    """Whether process `pid` is alive (not a zombie) and its command line contains `needle`."""
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return False
    return state != "Z" and needle in cmdline


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
