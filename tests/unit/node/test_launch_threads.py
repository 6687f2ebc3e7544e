"""OMP_NUM_THREADS on the nodes: orch gives torchrun's trainers the one thread a process that
torchrun would give them, so torchrun has no reason to print its banner on every node; a value
the job or the node sets is kept. Checked by running the launch script with a real bash."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.node import launch
from tests.unit.node.test_launch import cluster, run_script


def torchrun_env(tmp_path: Path, script: str, **node_env: str) -> dict[str, str]:
    """The environment the (fake) torchrun of `script` starts with."""
    exports = "".join(f"export {name}={value!r}\n" for name, value in node_env.items())
    result = run_script(tmp_path, exports + script)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_several_processes_a_node_get_one_thread_each(tmp_path: Path) -> None:
    script = launch.launch_script(cluster(procs_per_node=2), launch.NodeLaunch(0, "lo"))
    assert torchrun_env(tmp_path, script)["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("user_env", "node_env", "expected"),
    [({"OMP_NUM_THREADS": "4"}, {}, "4"), ({}, {"OMP_NUM_THREADS": "8"}, "8"), ({}, {}, None)],
    ids=["the job's", "the node's", "one process: none, as torchrun"],
)
def test_a_value_the_job_or_the_node_sets_is_kept(
    tmp_path: Path, user_env: dict[str, str], node_env: dict[str, str], expected: str | None
) -> None:
    procs = 2 if user_env or node_env else 1
    script = launch.launch_script(
        cluster(procs_per_node=procs, user_env=user_env), launch.NodeLaunch(0, "lo")
    )
    assert torchrun_env(tmp_path, script, **node_env).get("OMP_NUM_THREADS") == expected


def test_a_run_with_its_own_launcher_is_left_as_it_is() -> None:
    script = launch.launch_script(cluster(launcher="none"), launch.NodeLaunch(0, "lo"))
    assert "OMP_NUM_THREADS" not in script


def test_a_node_with_a_share_of_the_machines_gpus_sees_only_those(tmp_path: Path) -> None:
    """An allocation on a shared machine: its run sees its GPUs only (over any value the job
    gave); a node that is the whole machine sets nothing."""
    share = launch.NodeLaunch(0, "lo", gpu_indices=(4, 5))
    run = cluster(procs_per_node=2, user_env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    env = torchrun_env(tmp_path, launch.launch_script(run, share))
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5" and env["NVIDIA_VISIBLE_DEVICES"] == "4,5"
    whole_script = launch.launch_script(cluster(), launch.NodeLaunch(0, "lo"))
    (tmp_path / "whole").mkdir()
    whole = torchrun_env(tmp_path / "whole", whole_script)
    assert "CUDA_VISIBLE_DEVICES" not in whole and "NVIDIA_VISIBLE_DEVICES" not in whole
    with pytest.raises(ValueError, match="GPU indices"):
        launch.gpu_visibility([0, -1])
