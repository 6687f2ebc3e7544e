"""The fleet provider on real machines of the user's (`tests/support/fleet_hosts.py`): a host
with two GPUs and a CPU host, added as fleet `lab`.

- the plan refuses a job the fleet can never hold (with its size), an accelerator it does not
  have and a fleet that does not exist, each saying what to do;
- an allocation on the CPU host holds process slots, its own home and the job key's line;
  `terminate` ends it (its processes, line and folder), leaves the machine's sshd and the
  user's key alone, releases its claims, is idempotent, and refuses ids it never made;
- with no controller at all, an allocation's guard ends it at its max_runtime the same way:
  the machine is never powered off;
- an unhealthy machine is asked again once a while has passed (not at every poll of a queued
  job): answering, what the lost job left there is ended first, then it takes jobs again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.config import Settings
from orchestrator.control.verbs.fleets import add_fleet
from orchestrator.errors import FleetFull, FleetNotFound, InstancesNotFound, SpecError
from orchestrator.ledger.fleets import FleetBook
from orchestrator.ledger.store import Ledger, ledger_engine
from orchestrator.node.guard_protocol import GuardTerms
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.ssh.provider import REVIVE_EVERY_S, SshProvider
from orchestrator.remote.keys import ensure_identity
from orchestrator.spec.fleet_file import fleet_from_flags
from orchestrator.spec.model import Budget
from tests.support.fleet_hosts import FleetMachine, fleet_machines
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, list]]:
    root = tmp_path_factory.mktemp("fleet-provider")
    with fleet_machines(root, gpus=(2, 0)) as machines:
        settings = Settings(home=root / "orch")
        settings.home.mkdir()
        ledger = Ledger(ledger_engine(settings))
        request = fleet_from_flags(
            {"name": "lab", "hosts": [m.login for m in machines], "identity": machines[0].key,
             "price_per_hour": Decimal("4")},
            root,
        )  # fmt: skip
        add_fleet(ledger, request, owner="tester", now=datetime.now(UTC))
        yield settings, machines


def request(job: str, settings: Settings, **fields: object) -> LaunchRequest:
    identity = ensure_identity(settings.keys_dir(job), f"orch-{job}")
    base = LaunchRequest(job_id=job, cluster=job, count=1, gpus_per_node=2,
                         public_key=identity.public_key, fleet="lab")  # fmt: skip
    return replace(base, **fields)  # type: ignore[arg-type]


def allocations(machine: FleetMachine) -> list[str]:
    return sorted(p.name for p in (machine.home / ".orch-fleet").glob("s-*"))


def test_the_plan_refuses_what_the_fleet_can_never_hold(fleet: tuple[Settings, list]) -> None:
    settings, _ = fleet
    provider = SshProvider(settings)
    with pytest.raises(SpecError) as too_big:
        provider.plan(request("big", settings, count=3), Budget())
    assert "lab" in too_big.value.message and "2 host" in too_big.value.message
    with pytest.raises(SpecError) as wrong_gpu:
        provider.plan(request("a100", settings, accelerator="A100"), Budget())
    assert "A100" in wrong_gpu.value.message
    with pytest.raises(FleetNotFound) as missing:
        provider.plan(request("lost", settings, fleet="nope"), Budget())
    assert "lab" in missing.value.message and "orch fleet add" in (missing.value.hint or "")
    plan = provider.plan(request("fits", settings), Budget())
    assert plan.plan.price_per_node_hour == Decimal("4") and plan.document["fits_now"]


def test_an_allocation_on_a_cpu_host_ends_without_the_machine(
    fleet: tuple[Settings, list],
) -> None:
    settings, machines = fleet
    cpu_host = machines[1]
    provider = SshProvider(settings)
    keys_before = (cpu_host.home / ".ssh" / "authorized_keys").read_bytes()
    (holder,) = provider.launch(request("holder", settings))  # both GPUs of the GPU host
    cpus = len(FleetBook(Ledger(ledger_engine(settings))).get("lab")[1][1].slots())
    (instance,) = provider.launch(request("cpu", settings, gpus_per_node=cpus))
    try:
        assert instance.gpu_indices is None and instance.home is not None
        assert allocations(cpu_host) == [instance.instance_id]
        keys = (cpu_host.home / ".ssh" / "authorized_keys").read_text()
        assert keys.count(f"orch-allocation:{instance.instance_id}") == 1
        identity = ensure_identity(settings.keys_dir("cpu"), "orch-cpu")
        cluster = Cluster([instance], identity, connect_timeout=5)
        try:  # the job's key logs in, into the allocation's home
            said = cluster.head.run('echo "$HOME"; (sleep 300 &) ; echo started').stdout
        finally:
            cluster.close()
        assert said.split()[0] == instance.home
        assert [i.instance_id for i in provider.list_owned(job_id="cpu")] == [instance.instance_id]
    finally:
        ended = provider.terminate([instance.instance_id, holder.instance_id])
    assert ended <= datetime.now(UTC)
    assert allocations(cpu_host) == [] == allocations(machines[0]) and cpu_host.sshd_alive()
    assert (cpu_host.home / ".ssh" / "authorized_keys").read_bytes() == keys_before
    assert FleetBook(Ledger(ledger_engine(settings))).held(job_id="cpu") == []
    provider.terminate([instance.instance_id])  # idempotent
    with pytest.raises(InstancesNotFound):
        provider.terminate(["s-000000000000"])


def test_the_guard_ends_its_allocation_with_no_controller(fleet: tuple[Settings, list]) -> None:
    settings, machines = fleet
    gpu_host = machines[0]
    identity = ensure_identity(settings.keys_dir("alone"), "orch-alone")
    terms = GuardTerms(
        job_id="alone", interval_s=0.5, silence_s=1.0, allowance_s=1.0, deadman_s=None,
        stop_grace_s=1.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        runtime_deadline=datetime.now(UTC) + timedelta(seconds=4),
        lease_key=identity.public_key,
    )  # fmt: skip
    provider = SshProvider(settings)
    (instance,) = provider.launch(request("alone", settings, gpus_per_node=1, guard=terms))
    assert instance.gpu_indices == (0,)
    assert allocations(gpu_host) == [instance.instance_id]
    started = time.monotonic()
    wait_until(lambda: not allocations(gpu_host), "the guard to end its allocation", 60)
    assert time.monotonic() - started < 60
    assert gpu_host.sshd_alive()
    keys = (gpu_host.home / ".ssh" / "authorized_keys").read_text()
    assert "orch-allocation:" not in keys and keys.strip()
    provider.terminate([instance.instance_id])  # the controller's end finds it gone: fine
    assert FleetBook(Ledger(ledger_engine(settings))).held(job_id="alone") == []


def test_an_unhealthy_machine_that_answers_again_is_swept_then_used(
    fleet: tuple[Settings, list],
) -> None:
    settings, machines = fleet
    gpu_host = machines[0]
    provider = SshProvider(settings)
    book = FleetBook(Ledger(ledger_engine(settings)))
    (left,) = provider.launch(request("left", settings))
    # As after a power cut: its claim released, the machine unhealthy, its folder still there.
    book.release([left.instance_id], datetime.now(UTC))
    gpu_row = book.get("lab")[1][0]
    lost_at = datetime.now(UTC) - timedelta(seconds=REVIVE_EVERY_S + 1)  # not asked since
    book.mark_health(gpu_row.id, False, "stopped answering", lost_at)
    assert allocations(gpu_host) == [left.instance_id]
    # an H200 is on the GPU host alone: the job must wait for it, or have it back
    (back,) = provider.launch(request("back", settings, accelerator="H200"))
    try:
        assert allocations(gpu_host) == [back.instance_id]  # the leftover was ended first
        assert book.get("lab")[1][0].healthy
        keys = (gpu_host.home / ".ssh" / "authorized_keys").read_text()
        assert f"orch-allocation:{left.instance_id}" not in keys
    finally:
        provider.terminate([back.instance_id])
    # Lost just now: not asked again yet, so a job that needs it finds no room.
    book.mark_health(gpu_row.id, False, "stopped answering", datetime.now(UTC))
    try:
        with pytest.raises(FleetFull):
            provider.launch(request("soon", settings, accelerator="H200"))
    finally:
        book.mark_health(gpu_row.id, True, "", datetime.now(UTC))
