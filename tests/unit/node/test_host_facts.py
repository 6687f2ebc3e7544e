"""A fleet machine's probe output, read without trusting it (`orchestrator.node.host_facts`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.node.host_facts import (
    MAX_GPUS,
    MAX_TEXT,
    PROBE_COMMAND,
    GpuFact,
    HostFactsError,
    gpus_json,
    parse_facts,
)

GOOD = {
    "gpus": ["0, NVIDIA A100-SXM4-80GB, 81920", "1, NVIDIA A100-SXM4-80GB, 81920"],
    "cpus": ["32"],
    "memory": ["MemTotal:       263846672 kB"],
    "disk": ["/dev/nvme0n1p1  1055762868 55555 524288000  10% /home"],
    "python": ["3.10.12"],
    "torch": ["2.3.1+cu121"],
}


def output(**changes: list[str]) -> str:
    sections = {**GOOD, **changes}
    lines = []
    for name in ("gpus", "cpus", "memory", "disk", "python", "torch"):
        lines += [f"--orch-fact-{name}", *sections[name]]
    return "\n".join([*lines, "--orch-fact-end"]) + "\n"


def test_a_gpu_host_reads_whole() -> None:
    facts = parse_facts(output())
    assert facts.gpus == (
        GpuFact(0, "NVIDIA A100-SXM4-80GB", 81920),
        GpuFact(1, "NVIDIA A100-SXM4-80GB", 81920),
    )
    assert (facts.cpus, facts.memory_mib, facts.disk_free_gb) == (32, 257662, 500.0)
    assert (facts.python, facts.torch) == ("3.10.12", "2.3.1+cu121")
    assert json.loads(gpus_json(facts.gpus))[1] == {
        "index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920
    }  # fmt: skip


def test_a_cpu_host_without_nvidia_smi_python_or_torch() -> None:
    facts = parse_facts(output(gpus=[], python=[], torch=[]))
    assert facts.gpus == () and facts.python is None and facts.torch is None
    # nvidia-smi present but no device (exit 6): a CPU host too
    no_devices = ["No devices were found", "--orch-fact-gpus-failed 6"]
    assert parse_facts(output(gpus=no_devices)).gpus == ()


def test_gpus_come_by_index_whatever_order_nvidia_smi_prints() -> None:
    facts = parse_facts(output(gpus=["1, B, 10", "0, A, 20"]))
    assert [g.index for g in facts.gpus] == [0, 1]


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"gpus": ["NVIDIA-SMI has failed", "--orch-fact-gpus-failed 9"]}, "nvidia-smi failed"),
        ({"gpus": ["0, A100"]}, "not index, name, memory"),
        ({"gpus": ["0, A, 10", "0, A, 10"]}, "twice"),
        ({"gpus": ["-1, A, 10"]}, "GPU index"),
        ({"gpus": ["0, \x1b[31mA, 10"]}, "printable name"),
        ({"gpus": ["0, " + "A" * 200 + ", 10"]}, "printable name"),
        ({"gpus": ["0, A, 99999999999999999999999"]}, "memory"),
        ({"gpus": [f"{i}, A, 10" for i in range(MAX_GPUS + 1)]}, "at most"),
        ({"cpus": ["0"]}, "CPU count"),
        ({"cpus": ["4", "4"]}, "2 lines"),
        ({"cpus": ["many"]}, "CPU count"),
        ({"memory": ["MemTotal: lots"]}, "meminfo"),
        ({"disk": ["df: no"]}, "df printed"),
        ({"python": ["Python 3.10; rm -rf /"]}, "python3's version"),
        ({"torch": ["x" * 100]}, "torch's version"),
    ],
)
def test_garbage_is_refused_saying_what(changes: dict[str, list[str]], said: str) -> None:
    with pytest.raises(HostFactsError, match=said):
        parse_facts(output(**changes))


def test_missing_repeated_or_stray_sections_and_too_much_text_are_refused() -> None:
    with pytest.raises(HostFactsError, match="lacks its sections torch, end"):
        parse_facts(output().split("--orch-fact-torch")[0])
    with pytest.raises(HostFactsError, match="twice"):
        parse_facts(output() + "--orch-fact-cpus\n")
    with pytest.raises(HostFactsError, match="before its first section"):
        parse_facts("welcome to the machine\n" + output())
    with pytest.raises(HostFactsError, match="more than"):
        parse_facts(output() + "x" * MAX_TEXT)
    with pytest.raises(HostFactsError):
        parse_facts("")


def test_the_probe_command_reads_this_machine(tmp_path) -> None:
    """The command runs in a plain POSIX sh and its output parses (no nvidia-smi here)."""
    env = {"PATH": f"{sys.prefix}/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["sh", "-c", PROBE_COMMAND], capture_output=True, text=True, env=env)
    facts = parse_facts(done.stdout)
    assert facts.cpus >= 1 and facts.memory_mib > 0 and facts.disk_free_gb > 0
    assert facts.python is not None
