"""Two machines on one ledger for the tests: two ORCH_HOMEs (two machines to the ledger, each
with its own machine id) on one `sqlite:///` URL or PostgreSQL database and one local "cloud"
(`local.root`, as two machines share an AWS account), with short controller leases. Every node
and controller is gone after `shared_homes`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.control.process.machine_id import machine_id
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import Ledger, make_engine, utcnow
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    fast_env,
    processes_with_marker,
    run_orch,
)
from tests.support.waiting import wait_until

LEASE_S = 3  # short leases, so that a killed controller's lease expires within the test
ENV_VALUE = "env-value-7f3a91"
SECRET_VALUE = "secret-value-c5e2d8"


@dataclass
class Machine:
    home: Path
    env: dict[str, str]

    @property
    def id(self) -> str:
        return machine_id(self.home)

    def orch(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_orch(list(args), self.env, timeout=timeout)

    def controller_pid(self, job_id: str) -> int:
        return int((self.home / "jobs" / job_id / "controller.pid").read_text())


@dataclass
class Shared:
    url: str
    ledger: Ledger
    a: Machine
    b: Machine
    spec: Path


@contextlib.contextmanager
def shared_homes(url: str, tmp_path: Path) -> Iterator[Shared]:
    """Two homes on the ledger `url` and one local root under `tmp_path`, and a job spec
    (one node, 40 steps of 0.25 s, an env value and a secret); every node and controller
    gone after."""
    settings = {"ORCH_DATABASE_URL": url, "ORCH_LOCAL_ROOT": str(tmp_path / "cloud"),
                "ORCH_CONTROLLER_LEASE": str(LEASE_S), "ORCH_LEASE_RENEWAL": "1"}  # fmt: skip
    a, b = (Machine(tmp_path / n, fast_env(tmp_path / n, **settings)) for n in ("a", "b"))
    counter_workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: shared\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"run: {counter_run(40, step_s=0.25)}\n"
        f"env: {{RUN_LABEL: {ENV_VALUE}}}\nsecrets: {{API_TOKEN: {SECRET_VALUE}}}\n"
    )
    engine = make_engine(url)
    try:
        yield Shared(url, Ledger(engine), a, b, spec)
    finally:
        for machine in (a, b):
            for pid_file in (machine.home / "jobs").glob("*/controller.pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
        for machine in (a, b):  # each ends its own jobs' nodes: another home's job, its
            machine.orch("down", "--all", timeout=120)  # lease still live, it leaves alone
        engine.dispose()


def detach(machine: Machine, spec: Path) -> str:
    result = machine.orch("submit", str(spec), "--detach")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


def state(shared: Shared, job_id: str) -> str:
    return shared.ledger.get_job(job_id).state


def wait_for_state(shared: Shared, job_id: str, *wanted: str, timeout: float = 60) -> None:
    wait_until(lambda: state(shared, job_id) in wanted, f"{job_id} {wanted}", timeout, interval=0.2)


def open_instances(shared: Shared, job_id: str) -> list[str]:
    return [lease.instance_id for lease in shared.ledger.leases(job_id, open_only=True)]


def kill_controller(machine: Machine, job_id: str) -> None:
    pid = machine.controller_pid(job_id)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), "the kill", 10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def lease_expired(shared: Shared, job_id: str) -> None:
    def expired() -> bool:
        lease = ControllerLeases(shared.ledger).get(job_id)
        return lease is None or lease.expires_at < utcnow()

    wait_until(expired, f"{job_id}'s lease to expire", LEASE_S + 5, interval=0.2)


def hand_over(job_id: str, source: Machine, target: Machine) -> None:
    """Give `target` what driving the job takes: its record, secrets file and SSH keys."""
    (target.home / "jobs" / job_id).mkdir(parents=True, exist_ok=True)
    for name in ("job.json", "env.json"):
        shutil.copy2(source.home / "jobs" / job_id / name, target.home / "jobs" / job_id / name)
    shutil.copytree(source.home / "keys" / job_id, target.home / "keys" / job_id)


def lease_machine(shared: Shared, job_id: str) -> str | None:
    lease = ControllerLeases(shared.ledger).get(job_id)
    return None if lease is None else lease.machine


def assert_nodes_alive(instances: list[str]) -> None:
    for instance in instances:
        assert processes_with_marker(instance), f"{instance} was ended"
