"""What a dead job may not leave behind, checked against the host and the ledger.

Used by the crash trials and the network-fault tests. Every check returns a list of
human-readable problems (empty: nothing wrong), so a trial can print them in its table instead
of stopping at the first one.

- `NodeSightings` records every local node id an ORCH_HOME ever had (a node may be launched and
  terminated before any lease names it);
- `host_leaks` looks for processes, network namespaces, veths and node directories of those nodes,
  and for a bridge that no node uses any more;
- `lease_problems` checks that each lease is closed or belongs to a live, watched job, that no
  launch was duplicated and that every node that was billed has a lease;
- `ledger_problems` runs the ledger check (`orchestrator.ledger.check`).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.control.process.controllers import controller_running
from orchestrator.job_state import JobState
from orchestrator.ledger.check import check_ledger
from orchestrator.ledger.store import Lease, Ledger
from orchestrator.providers.local.host_network import HOST_LOCK
from orchestrator.providers.local.net import (
    NODE_MARKER,
    host_veth_name,
    is_instance_id,
    netns_name,
)
from orchestrator.providers.local.state import NodeStore, file_lock
from tests.support.waiting import wait_until

PROC = Path("/proc")


class NodeSightings:
    """Polls `ORCH_HOME/local/nodes` in a thread and remembers every node seen there: `seen`
    (its directory existed) and `billed` (its record named a started sshd: billing began)."""

    def __init__(self, home: Path, interval: float = 0.05) -> None:
        self.store = NodeStore(home / "local")
        self.interval = interval
        self.seen: set[str] = set()
        self.billed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="node-sightings")

    def __enter__(self) -> NodeSightings:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.look()

    def look(self) -> None:
        with contextlib.suppress(OSError):
            for entry in self.store.nodes_dir.iterdir():
                if not is_instance_id(entry.name):
                    continue
                self.seen.add(entry.name)
                if entry.name not in self.billed:
                    record = self.store.load(entry.name)
                    if record is not None and record.sshd_pid:
                        self.billed.add(entry.name)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(self.interval)


def _proc_blobs() -> Iterable[tuple[int, bytes, bytes]]:
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            yield int(entry.name), environ, cmdline


def node_processes(instance_ids: Iterable[str], home: Path | None = None) -> dict[int, str]:
    """Live processes of the given nodes (their marker) or naming `home` on their command
    line (sshd and metadata servers of its nodes), pid -> what matched."""
    markers = {f"{NODE_MARKER}={iid}".encode(): iid for iid in instance_ids}
    home_bytes = str(home).encode() + b"/" if home is not None else None
    found: dict[int, str] = {}
    for pid, environ, cmdline in _proc_blobs():
        for var in environ.split(b"\0"):
            if var in markers:
                found[pid] = f"node {markers[var]}"
                break
        else:
            if home_bytes is not None and home_bytes in cmdline:
                found[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]
    return found


def controller_processes(home: Path) -> list[int]:
    """Live orch processes (controllers included) whose ORCH_HOME is `home`."""
    wanted = f"ORCH_HOME={home}".encode()
    return [
        pid
        for pid, environ, cmdline in _proc_blobs()
        if wanted in environ.split(b"\0") and b"orchestrator" in cmdline
    ]


def _lines(argv: list[str]) -> list[str]:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    return out.stdout.splitlines() if out.returncode == 0 else []


def namespaces() -> set[str]:
    return {line.split()[0] for line in _lines(["ip", "netns", "list"]) if line.strip()}


def links() -> set[str]:
    """Names of the host's network interfaces (a veth's `@peer` suffix dropped)."""
    names = set()
    for line in _lines(["ip", "-o", "link", "show"]):
        parts = line.split(":", 2)
        if len(parts) > 1:
            names.add(parts[1].strip().split("@", 1)[0])
    return names


def orphan_bridge(bridge: str, *, settle_s: float = 3.0) -> str | None:
    """A problem when `bridge` exists with no node attached (looked at under the host lock,
    twice, so another ORCH_HOME's node being torn down right now is not taken for a leak)."""

    def gone_or_used() -> bool:
        with file_lock(HOST_LOCK):
            if bridge not in links():
                return True
            return bool(_lines(["ip", "-o", "link", "show", "master", bridge]))

    try:
        wait_until(gone_or_used, f"bridge {bridge} used or gone", settle_s, interval=0.5)
    except AssertionError:
        return f"bridge {bridge} is left with no node attached"
    return None


def host_leaks(settings: Settings, instance_ids: Iterable[str]) -> list[str]:
    """Processes, namespaces, veths and node directories of the given (dead) nodes that remain,
    and the bridge when no node uses it."""
    ids = sorted(set(instance_ids))
    problems = []
    for pid, what in sorted(node_processes(ids, settings.home).items()):
        problems.append(f"process {pid} ({what}) remains")
    present_ns, present_links = namespaces(), links()
    for iid in ids:
        if netns_name(iid) in present_ns:
            problems.append(f"namespace {netns_name(iid)} remains")
        if host_veth_name(iid) in present_links:
            problems.append(f"veth {host_veth_name(iid)} remains")
        if (settings.home / "local" / "nodes" / iid).exists():
            problems.append(f"node record {iid} remains")
    bridge = orphan_bridge(settings.local.bridge)
    if bridge:
        problems.append(bridge)
    return problems


def open_at(leases: list[Lease], moment: datetime, now: datetime) -> list[Lease]:
    """The leases open at `moment`: launched by then and not yet ended."""
    return [
        lease
        for lease in leases
        if lease.launched_at <= moment < (lease.ended_at or now) or lease.launched_at == moment
    ]


def lease_snapshots(leases: list[Lease], now: datetime) -> list[list[Lease]]:
    """What was open at each launch, in launch order: a lease's start is the only moment the
    set of open leases grows, so every overlap shows in one of these. (A node that stays through
    a recovery is open at its replacement peer's launch, as it should be.)"""
    moments = sorted({lease.launched_at for lease in leases})
    return [open_at(leases, moment, now) for moment in moments]


def lease_problems(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    now: datetime,
    billed: Iterable[str] = (),
) -> list[str]:
    """Leases of a job: each closed or its job live and watched; no duplicate launch (no rank
    twice among overlapping leases, never more than the job's nodes at once); every node in
    `billed` (its billing began) has a lease; a job that succeeded ran on a full launch."""
    job = ledger.get_job(job_id)
    leases = ledger.leases(job_id)
    problems = []
    watched = not JobState(job.state).is_final and controller_running(settings, job_id)
    for lease in leases:
        if lease.ended_at is None and not watched:
            problems.append(f"lease of {lease.instance_id} open, job {job.state} and unwatched")
    snapshots = lease_snapshots(leases, now)
    for snapshot in snapshots:
        ranks = [lease.rank for lease in snapshot]
        if len(snapshot) > job.nodes or len(set(ranks)) != len(ranks):
            ids = ", ".join(f"{lease.instance_id}@{lease.rank}" for lease in snapshot)
            problems.append(f"duplicate launch: {len(snapshot)} lease(s) open at once: {ids}")
    leased = {lease.instance_id for lease in leases}
    for instance_id in sorted(set(billed) - leased):
        problems.append(f"node {instance_id} ran without a lease")
    last = len(snapshots[-1]) if snapshots else 0
    if job.state == JobState.SUCCEEDED and last != job.nodes:
        problems.append(f"succeeded, but its last launch has {last} lease(s)")
    return problems


def ledger_problems(settings: Settings) -> list[str]:
    """What `orchestrator.ledger.check` finds in the ledger: SQLite's integrity and
    foreign-key checks and the ledger's invariants, open leases only of watched jobs."""
    verdict = check_ledger(settings.db_path, watched=lambda job: controller_running(settings, job))
    return [f"ledger: {line}" for line in [*verdict.integrity, *verdict.problems]]
