"""`orch fleet add / status / remove` against real sshd machines the test starts as a user's own
(`tests.support.fleet_hosts`): a GPU host's GPUs come from its nvidia-smi, a host without
nvidia-smi is a CPU host, each host key is pinned; a known_hosts file with another key, an
identity the machines do not authorize and a machine that is down are each refused, naming the
machine and the reason, with nothing recorded. One set of machines serves the whole module."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.ledger.fleets import FleetBook, FleetWaiter, NodeClaim
from orchestrator.ledger.store import Ledger, make_engine
from tests.support.fleet_hosts import GPU_MEMORY_MIB, FleetMachine, fleet_machines
from tests.support.helpers import orch_env, run_orch

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[FleetMachine]]:
    """A 2-GPU host, a CPU host, and a third machine that the unreachable test kills."""
    with fleet_machines(tmp_path_factory.mktemp("fleet"), gpus=[2, 0, 0]) as started:
        yield started


def fleets(env: dict[str, str]) -> list[dict]:
    done = run_orch(["fleet", "status", "--json"], env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["fleets"]


def test_add_records_each_host_as_found_then_status_and_remove(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    gpu_host, cpu_host, _ = machines
    env = orch_env(tmp_path / "orch")
    args = ["fleet", "add", "lab", "--host", gpu_host.login, "--host", cpu_host.login,
            "--identity", str(gpu_host.key), "--price-per-hour", "2.50"]  # fmt: skip
    done = run_orch([*args, "--json"], env, timeout=120)
    assert done.returncode == 0, done.stderr
    for machine in (gpu_host, cpu_host):  # one progress line per machine
        assert f"{machine.login}: " in done.stderr
    fleet = json.loads(done.stdout)
    assert (fleet["name"], fleet["price_per_hour"], fleet["price_unit"]) == ("lab", "2.50", "host")
    gpu, cpu = fleet["hosts"]
    assert gpu["login"] == gpu_host.login and gpu["host_key"] == gpu_host.host_key
    assert gpu["gpus"] == [{"index": i, "name": "NVIDIA H200", "memory_mib": GPU_MEMORY_MIB}
                           for i in (0, 1)]  # fmt: skip
    assert gpu["slots"] == gpu["free"] == [0, 1] and gpu["healthy"] is True
    assert gpu["python"] and gpu["torch"] and gpu["memory_mib"] > 0 and gpu["disk_free_gb"] > 0
    assert cpu["gpus"] == [] and cpu["host_key"] == cpu_host.host_key
    assert cpu["slots"] == list(range(cpu["cpus"]))  # a CPU host: process slots

    assert fleets(env)[0]["hosts"] == fleet["hosts"]
    shown = run_orch(["fleet", "status", "lab"], env, timeout=60)
    assert gpu_host.login in shown.stdout and "2 x NVIDIA H200" in shown.stdout
    assert "none (CPU)" in shown.stdout

    again = run_orch(args, env, timeout=60)  # the name is taken: refused before any probe
    assert again.returncode == 2 and "fleet named lab exists already" in again.stderr
    assert "probing" not in again.stderr

    removed = run_orch(["fleet", "remove", "lab"], env, timeout=60)
    assert removed.returncode == 0, removed.stderr
    assert fleets(env) == []
    assert gpu_host.sshd_alive() and cpu_host.sshd_alive()  # forgotten, never touched


def test_a_known_hosts_file_pins_keys_and_another_key_is_refused(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    gpu_host, cpu_host, _ = machines
    env = orch_env(tmp_path / "orch")
    known = tmp_path / "known_hosts"
    known.write_text(f"{gpu_host.address} {cpu_host.host_key}\n" + cpu_host.known_hosts_line())
    args = ["fleet", "add", "lab", "--host", gpu_host.login, "--host", cpu_host.login,
            "--identity", str(gpu_host.key), "--known-hosts", str(known)]  # fmt: skip
    done = run_orch(args, env, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "1 of 2 machine(s) of fleet lab could not be probed; nothing was recorded" in done.stderr
    assert f"{gpu_host.login}: {gpu_host.login} presented the host key" in done.stderr
    assert f"{cpu_host.login}: failed" not in done.stderr
    assert fleets(env) == []

    known.write_text(gpu_host.known_hosts_line() + cpu_host.known_hosts_line())
    done = run_orch([*args, "--json"], env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["known_hosts"] == str(known)


def test_an_identity_the_machines_do_not_authorize_is_refused(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    env = orch_env(tmp_path / "orch")
    done = run_orch(
        ["fleet", "add", "lab", "--host", machines[0].login, "--identity", str(other)],
        env,
        timeout=120,
    )
    assert done.returncode == 3
    assert f"{machines[0].login} refused the identity {other} for user root" in done.stderr
    assert fleets(env) == []


def test_a_machine_that_is_down_is_named_with_its_reason_and_nothing_is_recorded(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    gpu_host, _, dead = machines
    dead.kill()
    env = orch_env(tmp_path / "orch")
    args = ["fleet", "add", "lab", "--host", gpu_host.login, "--host", dead.login,
            "--host", f"root@{gpu_host.address}:2299", "--identity", str(gpu_host.key)]  # fmt: skip
    done = run_orch(args, env, timeout=180)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "2 of 3 machine(s)" in done.stderr
    assert f"{dead.login}: cannot reach {dead.login}: no route to host" in done.stderr
    assert f"{gpu_host.address}:2299: connection refused" in done.stderr
    assert f"{gpu_host.login}: 2 x NVIDIA H200" in done.stderr  # it answered, all the same
    assert fleets(env) == []


def test_a_fleet_file_and_a_fleet_busy_with_a_job(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    gpu_host, cpu_host, _ = machines
    home = tmp_path / "orch"
    env = orch_env(home)
    (tmp_path / "fleet.yaml").write_text(
        f"name: lab\nhosts: [{gpu_host.login}, {cpu_host.login}]\n"
        f"identity: {gpu_host.key}\nprice_per_gpu_hour: '1.10'\n"
    )
    done = run_orch(["fleet", "add", "--file", str(tmp_path / "fleet.yaml"), "--json"], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["price_unit"] == "gpu"

    book = FleetBook(Ledger(make_engine(home / "orch.db")))
    host_id = book.get("lab")[1][0].id
    assert host_id is not None
    now = datetime.now(UTC)
    claim = NodeClaim(rank=0, host_id=host_id, slots=(1,), instance_id="s-0123456789ab")
    assert book.claim("lab", "job-one", "someone", [claim], now)
    book.wait(FleetWaiter(job_id="job-two", fleet="lab", nodes=2, slots_per_node=2,
                          owner="someone", since=now))  # fmt: skip

    (status,) = fleets(env)
    assert status["hosts"][0]["free"] == [0]
    assert status["hosts"][0]["held"] == [
        {"slot": 1, "job": "job-one", "rank": 0, "instance_id": "s-0123456789ab"}
    ]
    assert [(w["position"], w["job"], w["nodes"]) for w in status["queue"]] == [(1, "job-two", 2)]
    assert status["usage"]["window_days"] == 7 and 0 <= status["usage"]["utilization"] <= 1
    shown = run_orch(["fleet", "status"], env, timeout=60)
    assert "1:job-one" in shown.stdout and "1/2" in shown.stdout
    assert "queue 1: job-two (2 node(s) x 2" in shown.stdout

    busy = run_orch(["fleet", "remove", "lab"], env, timeout=60)
    assert busy.returncode == 2 and "job-one" in busy.stderr
    assert [f["name"] for f in fleets(env)] == ["lab"]
    book.release(["s-0123456789ab"], now)
    book.stop_waiting("job-two")
    assert run_orch(["fleet", "remove", "lab"], env, timeout=60).returncode == 0


def test_a_machine_whose_tools_print_garbage_is_refused_with_what_it_printed(
    machines: list[FleetMachine], tmp_path: Path
) -> None:
    gpu_host = machines[0]
    trace = gpu_host.home / "bin" / "nvidia-smi.trace"
    kept = trace.read_text()
    trace.write_text(json.dumps({"mode": "garbage"}))
    try:
        env = orch_env(tmp_path / "orch")
        args = ["fleet", "add", "lab", "--host", gpu_host.login, "--identity", str(gpu_host.key)]
        done = run_orch(args, env, timeout=120)
    finally:
        trace.write_text(kept)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"{gpu_host.login}: its answer to the probe is not usable: " in done.stderr
    assert fleets(env) == []
