"""On-disk records of local nodes: `ORCH_HOME/local/nodes/<id>/node.json`, one per live node.

The record is the local provider's "cloud API": `list_owned` reads these files and nothing else,
so the provider can say what it runs without orch's database. A record is written atomically
(temporary file, fsync, rename) and removed with its node when the node is terminated.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.providers.base import Instance, Market
from orchestrator.providers.local.net import is_instance_id

RECORD_VERSION = 1
LAUNCH_LOCK = "launch.lock"  # held (shared) by launches while they make node directories
LEDGER_TAG = "orch:ledger"  # tag with the id of the ledger that launched the node


@dataclass
class NodeRecord:
    """What node.json holds about one local node."""

    instance_id: str
    job_id: str
    cluster: str
    rank: int
    mode: str  # "namespace" or "loopback"
    ip: str  # private address (127.0.0.1 on loopback)
    port: int  # sshd port (22 in a namespace)
    interface: str  # interface carrying `ip` on the node
    ssh_user: str
    home: str  # HOME of the node's sessions
    host_key: str  # "ssh-ed25519 AAAA..."
    market: Market
    instance_type: str
    price_per_hour: str  # Decimal as text
    launched_at: str  # UTC ISO 8601; billing starts here
    tags: dict[str, str] = field(default_factory=dict)
    sshd_pid: int | None = None  # pid of the node's sshd once started
    metadata_port: int | None = None  # port of the node's metadata endpoint once started
    reclaimed_at: str | None = None  # UTC ISO 8601 when a spot reclaim took the node
    version: int = RECORD_VERSION

    def to_instance(self) -> Instance:
        """The node as the Provider interface reports it."""
        return Instance(
            instance_id=self.instance_id,
            job_id=self.job_id,
            cluster=self.cluster,
            rank=self.rank,
            private_ip=self.ip,
            ssh_host=self.ip,
            ssh_port=self.port,
            ssh_user=self.ssh_user,
            host_key=self.host_key,
            interface=self.interface,
            market=self.market,
            instance_type=self.instance_type,
            price_per_hour=Decimal(self.price_per_hour),
            launched_at=datetime.fromisoformat(self.launched_at),
            tags=dict(self.tags),
            ledger_id=self.tags.get(LEDGER_TAG),
            metadata_url=(
                None
                if self.mode == "namespace" or self.metadata_port is None
                else f"http://127.0.0.1:{self.metadata_port}"
            ),
        )


class NodeStore:
    """The directory of node records under `root` (ORCH_HOME/local). Does no I/O until used."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes_dir = root / "nodes"
        self.ended_dir = root / "ended"  # one empty file per node ended (its id), kept

    def node_dir(self, instance_id: str) -> Path:
        """Directory of a node: its record, sshd files and `disk/`."""
        if not is_instance_id(instance_id):
            raise ValueError(f"not a local node id: {instance_id!r}")
        return self.nodes_dir / instance_id

    def create_dir(self, instance_id: str) -> Path:
        """Create an empty, private node directory (with its `disk/`) and return it."""
        path = self.node_dir(instance_id)
        (path / "disk").mkdir(mode=0o700, parents=True)
        path.chmod(0o700)
        return path

    def save(self, record: NodeRecord) -> None:
        """Write a node's record atomically."""
        path = self.node_dir(record.instance_id) / "node.json"
        write_atomic(path, json.dumps(asdict(record), indent=2, sort_keys=True) + "\n")

    def load(self, instance_id: str) -> NodeRecord | None:
        """A node's record, or None when the node has no (readable) record."""
        if not is_instance_id(instance_id):
            return None
        path = self.nodes_dir / instance_id / "node.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return NodeRecord(**raw)
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[NodeRecord]:
        """Every readable record, ordered by cluster then rank."""
        if not self.nodes_dir.is_dir():
            return []
        records = [
            rec for entry in self.nodes_dir.iterdir() if (rec := self.load(entry.name)) is not None
        ]
        return sorted(records, key=lambda r: (r.cluster, r.rank, r.instance_id))

    @contextlib.contextmanager
    def making(self) -> Iterator[None]:
        """Hold from creating node directories until their records are saved.

        A shared lock (launches run side by side) that the kernel drops when the holder dies,
        even by SIGKILL: while anyone holds it, `reap_unrecorded` leaves directories alone.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LAUNCH_LOCK, "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
            yield

    def reap_unrecorded(self) -> list[str]:
        """Remove the node directories that have no record, unless a launch is making nodes.

        A launcher killed between creating a node's directory and saving its record leaves one
        behind (host key, authorized_keys, an empty disk). Nothing ever ran in it: a node's
        processes start only once its record is saved. Returns the ids removed.
        """
        if not self.nodes_dir.is_dir():
            return []
        with open(self.root / LAUNCH_LOCK, "a+") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []
            removed = []
            for entry in self.nodes_dir.iterdir():
                if is_instance_id(entry.name) and not (entry / "node.json").exists():
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry.name)
            return removed

    def remove(self, instance_id: str) -> None:
        """Delete a node's directory, record and disk included, and remember that the node
        existed and ended (`was_ended`). Missing directories are fine."""
        if is_instance_id(instance_id):
            self.ended_dir.mkdir(parents=True, exist_ok=True)
            (self.ended_dir / instance_id).touch()
            shutil.rmtree(self.nodes_dir / instance_id, ignore_errors=True)

    def was_ended(self, instance_id: str) -> bool:
        """Whether a node of this id was removed by `remove` (so it existed here)."""
        return is_instance_id(instance_id) and (self.ended_dir / instance_id).exists()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive fcntl lock on `path` (created if missing) for the block's duration."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
