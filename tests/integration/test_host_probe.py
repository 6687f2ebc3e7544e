"""`remote.host_probe` against real sshd machines the test starts (`tests.support.fleet_hosts`):
the host key is pinned on first contact or from a known_hosts file, a wrong key or identity is
refused before anything runs, a machine that does not answer is named with the reason, and a
proxy jump reaches a machine through another."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import HostAuthFailed, HostKeyMismatch, HostUnreachable
from orchestrator.remote.host_probe import HostLogin, probe
from tests.support.fleet_hosts import FleetMachine, fleet_machines

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[FleetMachine]]:
    with fleet_machines(tmp_path_factory.mktemp("probe"), gpus=[1, 0]) as started:
        yield started


def login(machine: FleetMachine, **changes: object) -> HostLogin:
    fields: dict = {"user": "root", "address": machine.address, "port": 22,
                    "identity": machine.key, **changes}  # fmt: skip
    return HostLogin(**fields)


def test_first_contact_pins_the_key_the_host_shows(machines: list[FleetMachine]) -> None:
    got = probe(login(machines[0]), "echo $HOME", timeout=20)
    assert got.host_key == machines[0].host_key
    assert got.output == f"{machines[0].home}\n"


def test_known_hosts_pins_the_key_and_refuses_another_or_none(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    first, second = machines
    known = tmp_path / "known_hosts"
    known.write_text(first.known_hosts_line())
    assert probe(login(first, known_hosts=known), "true", 20).host_key == first.host_key

    known.write_text(f"{first.address} {second.host_key}\n")  # another machine's key
    marker = first.home / "ran"
    with pytest.raises(HostKeyMismatch, match=f"root@{first.address}:22 presented"):
        probe(login(first, known_hosts=known), f"touch {marker}", 20)
    assert not marker.exists()  # refused before it logged in

    with pytest.raises(HostKeyMismatch, match=f"has no host key for {second.address}"):
        probe(login(second, known_hosts=known), "true", 20)


def test_a_key_the_login_does_not_authorize_is_refused(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(HostAuthFailed, match=f"refused the identity {other}"):
        probe(login(machines[0], identity=other), "true", 20)
    with pytest.raises(HostAuthFailed, match="cannot read the identity"):
        probe(login(machines[0], identity=tmp_path / "absent"), "true", 20)


def test_a_machine_that_does_not_answer_is_named_with_the_reason(
    machines: list[FleetMachine],
) -> None:
    with pytest.raises(HostUnreachable, match=f"{machines[0].address}:2299: connection refused"):
        probe(login(machines[0], port=2299), "true", 20)
    with pytest.raises(HostUnreachable, match="did not finish in time"):
        probe(login(machines[0]), "sleep 30", 2)


def test_a_proxy_jump_reaches_the_machine_through_another(machines: list[FleetMachine]) -> None:
    jump, target = machines
    got = probe(login(target, proxy_jump=f"root@{jump.address}"), "echo $HOME", 20)
    assert got.host_key == target.host_key and got.output == f"{target.home}\n"
    with pytest.raises(HostUnreachable, match="the jump host could not reach it"):
        probe(login(target, port=2299, proxy_jump=f"root@{jump.address}:22"), "true", 20)
