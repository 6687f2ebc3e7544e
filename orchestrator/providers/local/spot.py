"""Spot behaviour of local nodes: spot capacity, each node's metadata endpoint, and reclaims.

A rehearsal of what a cloud does to spot machines:
- capacity: `ORCH_HOME/local/spot.json` says whether spot nodes can be had now (no file: yes),
  either fixed (`orch local spot on|off`) or by replaying an availability trace against wall
  time (`orch local spot --trace FILE`); a refused spot launch is a `CapacityError`, as on a
  cloud without spot capacity;
- every node runs a metadata endpoint (`orchestrator.node.imds_server`): inside its namespace at
  169.254.169.254:80, or on loopback at a port of its own (`Instance.metadata_url`);
- `reclaim` posts an interruption notice on that endpoint, waits out the notice, then takes
  the node the way a reclaim does: link down and every process killed at once, disk gone. The
  node's record stays, marked `reclaimed_at`, so the provider can say it was preempted until
  orch terminates it (which removes the record).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.errors import OrchError, ProviderError
from orchestrator.node.spot_notice import notice_document
from orchestrator.providers.local import net
from orchestrator.providers.local.state import NodeRecord, NodeStore
from orchestrator.providers.traces import SpotTrace, TraceClock, parse_trace

METADATA_ADDRESS = "169.254.169.254"
NOTICE_FILE = "notice.json"
READY_FILE = "metadata.port"
CAPACITY_VERSION = 1  # of spot.json
_READY_TIMEOUT_S = 10.0
NOTICE_CHECK_S = 0.5  # how often a reclaim under notice looks whether the owner let the node go


def spot_file(store: NodeStore) -> Path:
    return store.root / "spot.json"


@dataclass(frozen=True)
class SpotCapacity:
    """What `spot.json` says about spot launches: a fixed answer, or a trace replayed.

    With a trace, spot can be had while the trace's value at the current (scaled) tick is at
    least the number of nodes asked for; without one, `available` answers for every launch.
    """

    available: bool = True  # the answer when no trace is followed
    clock: TraceClock | None = None  # the trace in force, replayed against wall time

    def spot_count(self, at: datetime) -> int | None:
        """Spot instances the trace grants at `at`; None without a trace (no limit known)."""
        return None if self.clock is None else self.clock.spot_count(at)

    def available_at(self, at: datetime, nodes: int = 1) -> bool:
        """Can `nodes` spot nodes be had at `at`?"""
        if self.clock is None:
            return self.available
        return self.clock.spot_available(at, nodes)


def read_capacity(store: NodeStore) -> SpotCapacity:
    """The spot capacity in force: no file (or an unreadable one) grants spot."""
    try:
        document = json.loads(spot_file(store).read_text())
    except (OSError, ValueError):
        return SpotCapacity()
    if not isinstance(document, dict):
        return SpotCapacity()
    trace = document.get("trace")
    if isinstance(trace, dict):
        try:
            spot_trace = parse_trace(
                {"metadata": {"gap_seconds": trace.get("gap_seconds")}, "data": trace.get("data")},
                str(trace.get("name") or "trace"),
            )
            scale = float(document["time_scale"])
            started = datetime.fromisoformat(document["started_at"])
            return SpotCapacity(clock=TraceClock(spot_trace, started, scale))
        except (OrchError, KeyError, TypeError, ValueError):
            return SpotCapacity()
    return SpotCapacity(available=document.get("available") is not False)


def spot_available(store: NodeStore, nodes: int = 1, at: datetime | None = None) -> bool:
    """Whether a spot launch of `nodes` nodes is granted at `at` (default: now)."""
    return read_capacity(store).available_at(at or datetime.now(UTC), nodes)


def _write_capacity(store: NodeStore, document: dict[str, object]) -> None:
    path = spot_file(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"version": CAPACITY_VERSION, **document}) + "\n")


def set_spot_available(store: NodeStore, available: bool) -> None:
    """Grant or refuse spot launches from now on (written atomically); ends a trace replay."""
    _write_capacity(store, {"available": available})


def follow_trace(
    store: NodeStore,
    trace: SpotTrace,
    *,
    time_scale: float = 1.0,
    start_tick: int = 0,
    now: datetime | None = None,
) -> TraceClock:
    """Replay `trace` from now on: tick `start_tick` begins at `now`, and `time_scale` trace
    seconds pass per wall second. Returns the clock that spot launches are judged by.

    Raises ValueError for a scale that is not positive or a start tick outside the trace.
    """
    if not 0 <= start_tick < len(trace):
        raise ValueError(f"start tick {start_tick} is outside the trace (0-{len(trace) - 1})")
    began = now or datetime.now(UTC)
    clock = TraceClock(
        trace, began - timedelta(seconds=start_tick * trace.gap_s / time_scale), time_scale
    )
    _write_capacity(
        store,
        {
            "trace": {"name": trace.name, "gap_seconds": trace.gap_s, "data": list(trace.counts)},
            "started_at": clock.started_at.isoformat(),
            "time_scale": time_scale,
            "start_tick": start_tick,
        },
    )
    return clock


def metadata_argv(rec: NodeRecord, node_dir: Path, port: int, ready_file: Path) -> list[str]:
    """The command that serves a node's metadata (run inside its namespace when it has one)."""
    bind = METADATA_ADDRESS if rec.mode == "namespace" else "127.0.0.1"
    argv = [
        sys.executable, "-m", "orchestrator.node.imds_server", "--bind", bind, "--port", str(port),
        "--instance-id", rec.instance_id, "--notice-file", str(node_dir / NOTICE_FILE),
        "--ready-file", str(ready_file),
    ]  # fmt: skip
    if rec.mode == "namespace":
        return ["ip", "netns", "exec", net.netns_name(rec.instance_id), *argv]
    return argv


def start_metadata_endpoint(rec: NodeRecord, node_dir: Path) -> None:
    """Start the node's metadata endpoint, detached; `wait_metadata_endpoint` waits for it.

    Namespace nodes get 169.254.169.254 on their loopback interface and the endpoint on port
    80 there (as on EC2); loopback nodes get a free port on 127.0.0.1.
    """
    ready = node_dir / READY_FILE
    ready.unlink(missing_ok=True)
    if rec.mode == "namespace":
        ns = net.netns_name(rec.instance_id)
        subprocess.run(
            ["ip", "-n", ns, "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"],
            capture_output=True, check=False,
        )  # fmt: skip
    argv = metadata_argv(rec, node_dir, 80 if rec.mode == "namespace" else 0, ready)
    env = {"PATH": ":".join(net.SYSTEM_PATH), net.NODE_MARKER: rec.instance_id}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])  # where `orchestrator` is
    log = node_dir / "metadata.log"
    subprocess.run(net.detached_argv(argv, log), env=env, cwd="/", capture_output=True, check=False)


def wait_metadata_endpoint(rec: NodeRecord, node_dir: Path) -> None:
    """Return once the node's endpoint serves, with `rec.metadata_port` filled in."""
    ready = node_dir / READY_FILE
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not ready.exists():
        if time.monotonic() > deadline:
            log = node_dir / "metadata.log"
            tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
            raise ProviderError(
                f"the metadata endpoint of node {rec.instance_id} did not start:\n{tail}"
            )
        time.sleep(0.02)
    rec.metadata_port = int(ready.read_text())


def metadata_url(rec: NodeRecord) -> str | None:
    """What the node itself polls; None means EC2's address (namespace nodes)."""
    if rec.mode == "namespace" or rec.metadata_port is None:
        return None
    return f"http://127.0.0.1:{rec.metadata_port}"


def post_notice(store: NodeStore, instance_id: str, at: datetime) -> None:
    """Make the node's metadata endpoint answer with a notice for a reclaim at `at`."""
    path = store.node_dir(instance_id) / NOTICE_FILE
    write_atomic(path, json.dumps(notice_document(at)) + "\n")


def reclaim(
    store: NodeStore,
    instance_id: str,
    notice_s: float,
    kill_node: Callable[[str], bool],
) -> datetime | None:
    """Reclaim a node like a cloud does; returns the UTC time it was taken.

    With `notice_s` > 0 the notice is served for that long first. Then, at once: the node's
    link goes down, every process of it is killed, its disk is removed, and its record is
    marked `reclaimed_at` (billing stops then). Returns None as soon as the node's owner
    terminates it during the notice (nothing left to take; found within
    `NOTICE_CHECK_S`). Raises `ProviderError` for a node that is not running (unknown, or
    already reclaimed).
    """
    rec = store.load(instance_id)
    if rec is None or rec.reclaimed_at is not None:
        raise ProviderError(
            f"local node {instance_id} is not running", hint="see `orch status JOB --json`"
        )
    if notice_s > 0:
        post_notice(store, instance_id, datetime.now(UTC) + timedelta(seconds=notice_s))
        ends = time.monotonic() + notice_s
        while (left := ends - time.monotonic()) > 0:
            time.sleep(min(left, NOTICE_CHECK_S))
            if store.load(instance_id) is None:
                return None
    if rec.mode == "namespace":
        ns = net.netns_name(instance_id)
        subprocess.run(
            ["ip", "-n", ns, "link", "set", "dev", net.NODE_INTERFACE, "down"],
            capture_output=True, check=False,
        )  # fmt: skip
    if not kill_node(instance_id):
        raise ProviderError(f"processes of local node {instance_id} survived the reclaim")
    taken = datetime.now(UTC)
    rec = store.load(instance_id)
    if rec is None:  # terminated by its owner meanwhile
        return None
    rec.reclaimed_at = taken.isoformat()
    try:
        store.save(rec)
    except FileNotFoundError:  # ... or right now
        return None
    if rec.mode == "namespace":
        for argv in net.node_net_teardown_argvs(instance_id):
            subprocess.run(argv, capture_output=True, check=False)
    disk = store.node_dir(instance_id) / "disk"
    subprocess.run(["rm", "-rf", "--one-file-system", str(disk)], capture_output=True, check=False)
    return taken
