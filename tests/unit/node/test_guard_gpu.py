"""The node guard's GPU reading (`guard.gpu_utilizations`) against the nvidia-smi stand-in.

The stand-in (tests/fixtures/nvidia_smi_replay.py) is put first on PATH as `nvidia-smi`, as
on a node, and replays a trace written next to it: real H200 records, `[N/A]`, the driver's
failure, junk, no GPU, and a call that never returns.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.node import guard
from orchestrator.node.guard_protocol import GuardTerms
from tests.support.helpers import processes_with_marker

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
STAND_IN = FIXTURES / "nvidia_smi_replay.py"


class StandIn:
    """`nvidia-smi` on PATH, replaying the trace `play` writes."""

    def __init__(self, bin_dir: Path) -> None:
        self.path = bin_dir / "nvidia-smi"
        source = STAND_IN.read_text().split("\n", 1)[1]
        self.path.write_text(f"#!{sys.executable}\n{source}")
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)
        self.trace = bin_dir / "nvidia-smi.trace"

    def play(self, mode: str, gpus: list[list[object]] | None = None) -> None:
        self.trace.write_text(json.dumps({"mode": mode, "gpus": gpus or []}))


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("ORCH_FAKE_SMI_TRACE", raising=False)
    return StandIn(bin_dir)


def h200_sample() -> list[list[object]]:
    """The first reading of the recorded H200 node: [util, mem used, mem total, uuid] by GPU."""
    lines = (FIXTURES / "nvidia_smi_h200.csv").read_text().splitlines()
    first = [line.split(", ") for line in lines[:8]]
    assert [int(row[0]) for row in first] == list(range(8))
    return [[float(row[2]), float(row[3]), float(row[4]), row[1]] for row in first]


def test_the_guard_reads_every_gpus_utilization_from_nvidia_smi(smi: StandIn) -> None:
    """The guard's query, in the real output format, gives one utilization per GPU."""
    sample = h200_sample()
    smi.play("normal", sample)
    assert guard.gpu_utilizations(timeout_s=10) == [gpu[0] for gpu in sample]
    smi.play("normal", [[0, 512, 143771], [3, 512, 143771]])
    assert guard.gpu_utilizations(timeout_s=10) == [0.0, 3.0]


@pytest.mark.parametrize(
    ("mode", "gpus"),
    [
        ("normal", [[97, 40123, 143771], ["[N/A]", 40123, 143771]]),  # one GPU unknown
        ("fail", None),  # the driver's error, exit 9
        ("garbage", None),  # no record among the lines
        ("none", None),  # "No devices were found", exit 6
    ],
)
def test_an_unusable_reading_is_no_reading(
    smi: StandIn, mode: str, gpus: list[list[object]] | None
) -> None:
    """[N/A] on any GPU, a failing driver, junk or no GPU: no reading (the guard then falls
    back on the job's CPU use), never a list that could pass for idle GPUs."""
    if mode == "none":
        smi.trace.unlink(missing_ok=True)
    else:
        smi.play(mode, gpus)
    assert guard.gpu_utilizations(timeout_s=10) is None


def test_no_nvidia_smi_on_the_node_is_no_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert guard.gpu_utilizations(timeout_s=10) is None


def test_a_hanging_nvidia_smi_is_given_up_at_the_timeout_and_killed(smi: StandIn) -> None:
    """A call stuck in the driver costs the guard at most its timeout, and leaves nothing
    running behind."""
    smi.play("hang")
    started = time.monotonic()
    assert guard.gpu_utilizations(timeout_s=1.0) is None
    assert 1.0 <= time.monotonic() - started < 6.0
    assert processes_with_marker(str(smi.path)) == []


def idle_terms(tmp_path: Path, gpu_indices: tuple[int, ...] | None = None) -> Path:
    """The terms file of a job with a 60 s idle timeout, for a node with `gpu_indices`."""
    terms = GuardTerms(
        job_id="j-1", interval_s=1.0, silence_s=10.0, allowance_s=100.0, deadman_s=600.0,
        stop_grace_s=5.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        idle_timeout_s=60.0,
    )  # fmt: skip
    path = tmp_path / "terms.json"
    path.write_text(
        terms.for_node(
            now=datetime.now(UTC), hourly_usd=Decimal(1), poweroff="true",
            home=str(tmp_path / "home"), gpu_indices=gpu_indices,
        )
    )  # fmt: skip
    return path


def test_the_guards_idle_clock_follows_the_gpus_and_falls_back_on_cpu(
    smi: StandIn, tmp_path: Path
) -> None:
    """Idle GPUs start the idle clock and busy ones reset it; with [N/A] the guard measures
    the job's processes instead."""
    node = guard.Guard(str(idle_terms(tmp_path)))
    leader = os.getpid()  # a live process stands for the run
    smi.play("normal", [[2, 512, 143771], [4, 512, 143771]])
    assert node.idle_for(1000.0, leader) == 0.0
    assert node.idle_for(1030.0, leader) == 30.0
    smi.play("normal", [[2, 512, 143771], [60, 512, 143771]])
    assert node.idle_for(1040.0, leader) == 0.0
    assert node.cpu_last is None
    smi.play("normal", [[2, 512, 143771], ["[N/A]", 512, 143771]])
    node.idle_for(1050.0, leader)
    assert node.cpu_last is not None and node.cpu_last[0] == 1050.0


def test_a_node_with_a_share_of_the_machines_gpus_counts_only_those(
    smi: StandIn, tmp_path: Path
) -> None:
    """An allocation on a shared machine (terms' `gpu_indices`): another job busy on the
    machine's other GPUs neither keeps this node from idling nor is read as its own."""
    smi.play("normal", [[2, 512, 143771], [90, 512, 143771], [3, 512, 143771]])
    assert guard.gpu_utilizations(timeout_s=10, indices={0, 2}) == [2.0, 3.0]
    path = idle_terms(tmp_path, gpu_indices=(0, 2))
    assert json.loads(path.read_text())["gpu_indices"] == [0, 2]
    node = guard.Guard(str(path))
    leader = os.getpid()
    assert node.idle_for(1000.0, leader) == 0.0
    assert node.idle_for(1030.0, leader) == 30.0  # GPU 1 at 90 %: not this node's
    smi.play("normal", [[2, 512, 143771], [90, 512, 143771], [60, 512, 143771]])
    assert node.idle_for(1040.0, leader) == 0.0  # its own GPU 2 busy
