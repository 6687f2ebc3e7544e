"""Shared parts of the controller-host tests: a local node to adopt, a laptop whose hosts are
loopback local nodes, and process look-ups."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import load_settings
from orchestrator.job_state import FINAL_STATES
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    fast_env,
    processes_with_marker,
    run_orch,
)
from tests.support.waiting import wait_until


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


@dataclass
class Laptop:
    """The user's side of a controller-host test: its environment and the local "cloud" (the
    provider of its local root, where a loopback host and its jobs' nodes are peers)."""

    env: dict[str, str]
    provider: LocalProvider

    def orch(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        done = run_orch(list(args), self.env, timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    def job(self, job_id: str) -> dict:
        code, out, err = self.orch("status", job_id, "--json", timeout=60)
        assert code == 0, err
        return json.loads(out)

    def host_up(self, *flags: str) -> dict:
        """`orch controller up --autostop 0 --json FLAGS`; its document."""
        code, out, err = self.orch("controller", "up", "--autostop", "0", "--json", *flags,
                                   timeout=300)  # fmt: skip
        assert code == 0, out + err
        return {**json.loads(out), "stderr": err}

    def submit_counter(
        self, directory: Path, name: str, nodes: int, steps: int, extra: str = ""
    ) -> str:
        """Submit a step-counter job of `nodes` nodes with `--remote` (`extra`: more lines of
        its spec); returns its id once it trains (step 2)."""
        counter_workdir(directory)
        spec = directory / "job.yaml"
        spec.write_text(
            f"name: {name}\nworkdir: work\nresources: {{nodes: {nodes}, gpus_per_node: 1}}\n"
            f"run: {counter_run(steps, step_s=0.5)}\n{extra}"
        )
        code, out, err = self.orch("submit", str(spec), "--remote")
        assert code == 0, out + err
        job_id = out.strip().splitlines()[-1]
        wait_until(
            lambda: (self.job(job_id)["step"] or 0) >= 2, f"{job_id} to train", 90, interval=0.5
        )
        return job_id

    def wait_end(self, job_id: str, timeout: float) -> dict:
        def ended() -> dict | None:
            job = self.job(job_id)
            return job if job["state"] in FINAL_STATES else None

        return wait_until(ended, f"{job_id} to end", timeout, interval=1)


@contextmanager
def loopback_laptop(directory: Path, **extra: str) -> Iterator[Laptop]:
    """A laptop (ORCH_HOME `directory/orch`) whose launched local hosts run in loopback mode,
    so that their jobs' nodes outlive them; on exit its host is taken down and whatever the
    test left running in its local root is ended."""
    env = fast_env(directory / "orch", ORCH_HOST_TICK="1", ORCH_LOCAL_NETWORK="loopback",
                   **extra)  # fmt: skip
    provider = LocalProvider(load_settings(env))
    try:
        yield Laptop(env, provider)
    finally:
        run_orch(["controller", "down", "--force"], env, timeout=120)
        left = provider.list_owned()
        provider.terminate([i.instance_id for i in left])
