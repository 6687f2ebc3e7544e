"""Shared parts of the controller-host tests: a local node to adopt, and process look-ups."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import load_settings
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import fast_env, processes_with_marker


@dataclass(frozen=True)
class AdoptableNode:
    """A running local node that `orch controller up --host` can adopt."""

    instance: Instance
    key: Path  # private key that logs in to it
    env: dict[str, str]  # the laptop's environment (its ORCH_HOME, the daemon's tick)
    provider: LocalProvider

    @property
    def home(self) -> Path:
        return Path(self.env["ORCH_HOME"])

    @property
    def root(self) -> Path:
        """orch's folder on the node (`~/.orch-host` of its login user), seen from here."""
        return Path(self.provider.store.node_dir(self.instance.instance_id)) / "disk/.orch-host"

    def up_args(self, autostop: str) -> list[str]:
        """`orch controller up --host ...` arguments adopting this node, `--json` output."""
        target = f"{self.instance.ssh_user}@{self.instance.ssh_host}"
        return ["controller", "up", "--host", target, "--port", str(self.instance.ssh_port),
                "--identity", str(self.key), "--autostop", autostop, "--json"]  # fmt: skip


@contextmanager
def adoptable_node(directory: Path, tick_s: str = "1") -> Iterator[AdoptableNode]:
    """One local node to adopt (ORCH_HOME `directory/orch`, daemon tick `tick_s` seconds),
    reachable with the key `directory/key`; terminated on exit, whatever happened."""
    key = directory / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    env = fast_env(directory / "orch", ORCH_HOST_TICK=tick_s)
    provider = LocalProvider(load_settings(env))
    (instance,) = provider.launch(
        LaunchRequest("host-to-adopt", "host-to-adopt", 1, 1, key.with_suffix(".pub").read_text())
    )
    try:
        yield AdoptableNode(instance, key, env, provider)
    finally:
        provider.terminate([instance.instance_id])


def cmdlines_with(needle: str) -> list[str]:
    """Command lines (arguments joined by spaces) of the processes that mention `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in line:
                found.append(line.replace(b"\0", b" ").decode(errors="replace"))
    return found


def node_cmdlines(instance_id: str, needle: str) -> list[str]:
    """Command lines mentioning `needle` of the processes of the local node `instance_id` (its
    marker is in their environment; their paths are the node's, the same on every node)."""
    found = []
    for pid in processes_with_marker(instance_id):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in line:
            found.append(line.replace(b"\0", b" ").decode(errors="replace"))
    return found
