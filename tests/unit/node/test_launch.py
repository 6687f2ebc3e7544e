"""The node launch script and probes, checked by running them with a real bash."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.node import file_write, launch
from tests.support.waiting import wait_until


def cluster(**overrides: object) -> launch.ClusterLaunch:
    base: dict = dict(
        job_id="job-1",
        run="echo run",
        setup=None,
        num_nodes=2,
        procs_per_node=2,
        master_addr="10.213.0.2",
        master_port=29500,
        node_ips=["10.213.0.2", "10.213.0.3"],
        checkpoint_dir="ckpt",
    )
    base.update(overrides)
    return launch.ClusterLaunch(**base)


def test_node_paths_follow_the_spec_rules() -> None:
    layout = launch.NodeLayout("j")
    assert layout.node_path("~/ckpt") == "ckpt"
    assert layout.node_path("ckpt/") == "orch-jobs/j/workdir/ckpt"
    assert layout.node_path("/data/ckpt") == "/data/ckpt"
    assert layout.node_path(None) == "orch-jobs/j/checkpoints"


def test_torchrun_args_carry_the_topology() -> None:
    args = launch.torchrun_args(cluster(), launch.NodeLaunch(1, "eth0"))
    assert "--nnodes=2" in args and "--nproc_per_node=2" in args and "--node_rank=1" in args
    assert "--master_addr=10.213.0.2" in args and "--master_port=29500" in args
    assert args[-3:] == ["bash", "-c", "echo run"]


def run_script(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run a launch script with HOME=tmp_path and a fake torchrun that prints its env."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'while [ "$1" != "bash" ]; do shift; done; shift; shift\n'
        'printf "%s" "$1" > "$HOME/run-arg"; env > "$HOME/env"; bash -c "$1"\n'
    )
    fake.chmod(0o755)
    (tmp_path / "orch-jobs/job-1/workdir").mkdir(parents=True)
    (tmp_path / "orch-jobs/job-1/run").mkdir(parents=True)
    env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )


NASTY = 'it\'s "quoted" $HOME `id`; echo pwned\nnext line ünïcode'


def test_user_values_reach_the_node_exactly(tmp_path: Path) -> None:
    script = launch.launch_script(
        cluster(run=f"printf '%s' {__import__('shlex').quote(NASTY)} > out", user_env={"X": NASTY}),
        launch.NodeLaunch(0, "eth0"),
    )
    result = run_script(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "orch-jobs/job-1/workdir/out").read_text() == NASTY
    env_text = (tmp_path / "env").read_text()
    assert f"X={NASTY}" in env_text
    assert f"ORCH_CHECKPOINT_DIR={tmp_path}/ckpt" in env_text
    assert "ORCH_NODE_RANK=0" in env_text and "GLOO_SOCKET_IFNAME=eth0" in env_text
    assert (tmp_path / "orch-jobs/job-1/run/exit_code").read_text().strip() == "0"


def test_exit_code_and_setup_failure_are_recorded(tmp_path: Path) -> None:
    result = run_script(
        tmp_path, launch.launch_script(cluster(run="exit 3"), launch.NodeLaunch(0, "lo"))
    )
    assert result.returncode == 3
    assert (tmp_path / "orch-jobs/job-1/run/exit_code").read_text().strip() == "3"


def test_failed_setup_stops_before_torchrun(tmp_path: Path) -> None:
    script = launch.launch_script(
        cluster(setup="false", run="touch ran"), launch.NodeLaunch(0, "lo")
    )
    result = run_script(tmp_path, script)
    assert result.returncode == launch.SETUP_FAILED_EXIT
    assert not (tmp_path / "orch-jobs/job-1/workdir/ran").exists()


def test_invalid_env_name_is_refused() -> None:
    with pytest.raises(ValueError):
        launch.launch_script(cluster(user_env={"A B": "x"}), launch.NodeLaunch(0, "lo"))


@pytest.mark.parametrize(
    ("output", "state", "code", "size", "log"),
    [
        (f"{launch.PROBE_MARK} running 10\nabc", "running", None, 10, "abc"),
        (f"{launch.PROBE_MARK} exit 3 7\n", "exited", 3, 7, ""),
        (f"{launch.PROBE_MARK} not-started 0\n", "not-started", None, 0, ""),
        ("garbage", "vanished", None, 0, ""),
        (f"{launch.PROBE_MARK} exit x 1\n", "vanished", None, 0, ""),
    ],
)
def test_parse_probe(output: str, state: str, code: int | None, size: int, log: str) -> None:
    probe = launch.parse_probe(output)
    assert (probe.state, probe.exit_code, probe.log_size, probe.new_log) == (state, code, size, log)


def test_start_and_probe_commands_against_a_real_shell(tmp_path: Path) -> None:
    layout = launch.NodeLayout("job-1")
    run_dir = tmp_path / layout.run_dir
    run_dir.mkdir(parents=True)
    # It runs until the test says go (20 s at most), whatever the machine's load.
    (run_dir / "launch.sh").write_text(
        'echo hello; for _ in $(seq 400); do [ -e "$HOME/go" ] && break; sleep 0.05; done\n'
    )
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}

    def sh(command: str) -> str:
        return subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=10
        ).stdout

    pid = sh(launch.start_command(layout)).strip()
    assert pid.isdigit()
    again = subprocess.run(["bash", "-c", launch.start_command(layout)], env=env, timeout=10)
    assert again.returncode == 3  # never started twice
    assert launch.parse_probe(sh(launch.probe_command(layout, 0))).state == "running"
    (tmp_path / "go").touch()

    def ended() -> launch.NodeProbe | None:
        probe = launch.parse_probe(sh(launch.probe_command(layout, 0)))
        return probe if probe.state != "running" else None

    probe = wait_until(ended, "the script's end once told to go", 10, interval=0.1)
    assert probe.state == "vanished"  # no exit_code file: the script is not a launch script
    assert probe.new_log == "hello\n"
    (run_dir / "exit_code").write_text("0\n")
    assert launch.parse_probe(sh(launch.probe_command(layout, 6))).exit_code == 0


def test_free_port_prefers_the_default_and_avoids_a_taken_one() -> None:
    import socket

    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        out = subprocess.run(
            ["bash", "-c", launch.free_port_command(taken)], capture_output=True, text=True
        ).stdout
        assert int(out) != taken and int(out) > 0
    finally:
        holder.close()


def test_launcher_none_runs_the_command_once_as_written_with_the_rendezvous_in_its_env(
    tmp_path: Path,
) -> None:
    """No torchrun: `run` itself, once, sees MASTER_ADDR/PORT, NODE_RANK and SkyPilot's names
    (the fake torchrun on the PATH would leave a `run-arg` file had it been called)."""
    script = launch.launch_script(
        cluster(run="env > run-env; exit 4", launcher="none"), launch.NodeLaunch(1, "eth0")
    )
    result = run_script(tmp_path, script)
    assert result.returncode == 4
    assert not (tmp_path / "run-arg").exists(), "torchrun was started"
    assert (tmp_path / "orch-jobs/job-1/run/exit_code").read_text().strip() == "4"
    env_text = (tmp_path / "orch-jobs/job-1/workdir/run-env").read_text()
    for line in ("MASTER_ADDR=10.213.0.2", "MASTER_PORT=29500", "NODE_RANK=1",
                 "SKYPILOT_NODE_RANK=1", "SKYPILOT_NUM_NODES=2", "SKYPILOT_NUM_GPUS_PER_NODE=2",
                 "ORCH_NODE_RANK=1"):  # fmt: skip
        assert f"\n{line}\n" in f"\n{env_text}", line
    assert "SKYPILOT_NODE_IPS=10.213.0.2\n10.213.0.3\n" in env_text  # newline-separated


def test_under_torchrun_the_run_sees_skypilot_s_names_but_torchrun_sets_the_rendezvous(
    tmp_path: Path,
) -> None:
    result = run_script(tmp_path, launch.launch_script(cluster(), launch.NodeLaunch(0, "lo")))
    assert result.returncode == 0, result.stderr
    env_text = (tmp_path / "env").read_text()
    assert "SKYPILOT_NODE_RANK=0" in env_text and "SKYPILOT_NUM_NODES=2" in env_text
    assert "\nNODE_RANK=" not in env_text and "\nMASTER_ADDR=" not in env_text


def _documented_runs(test_name: str) -> list[str]:
    """The `run` of each YAML example in docs/spec.md marked as covered by `test_name`."""
    import re

    import yaml

    page = (Path(__file__).resolve().parents[3] / "docs" / "spec.md").read_text()
    marker = rf"<!-- example: covered-by tests/unit/node/test_launch.py::{test_name} -->\n```yaml\n"
    blocks = re.findall(marker + r"(.*?)```", page, re.S)
    return [yaml.safe_load(block)["run"] for block in blocks]


def test_the_documented_accelerate_and_deepspeed_runs_get_the_cluster_s_rendezvous(
    tmp_path: Path,
) -> None:
    """Each launcher (a stand-in recording its arguments: neither is installed here) is
    started on node 1 with the cluster's size, its rank and node 0's address and port."""
    runs = _documented_runs(
        "test_the_documented_accelerate_and_deepspeed_runs_get_the_cluster_s_rendezvous"
    )
    assert len(runs) == 2
    for n, run in enumerate(runs):
        home = tmp_path / f"run-{n}"
        (home / "bin").mkdir(parents=True)
        for name in ("accelerate", "deepspeed"):
            stub = home / "bin" / name
            stub.write_text(
                f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{tmp_path}/{name}-args"\n'
                f'[ -f hostfile ] && cp hostfile "{tmp_path}/hostfile"; exit 0\n'
            )
            stub.chmod(0o755)
        result = run_script(home, launch.launch_script(
            cluster(run=run, launcher="none"), launch.NodeLaunch(1, "eth0")
        ))  # fmt: skip
        assert result.returncode == 0, result.stderr
    accelerate = (tmp_path / "accelerate-args").read_text().splitlines()
    assert accelerate[:2] == ["launch", "--multi_gpu"] and accelerate[-1] == "train.py"
    flags = dict(zip(accelerate[2:-1:2], accelerate[3:-1:2], strict=True))
    assert {k: flags[k] for k in ("--num_machines", "--num_processes", "--machine_rank")} == {
        "--num_machines": "2", "--num_processes": "4", "--machine_rank": "1",
    }  # fmt: skip
    assert (flags["--main_process_ip"], flags["--main_process_port"]) == ("10.213.0.2", "29500")
    deepspeed = (tmp_path / "deepspeed-args").read_text().splitlines()
    assert deepspeed[:7] == [
        "--hostfile", "hostfile", "--no_ssh", "--node_rank", "1", "--master_addr", "10.213.0.2",
    ]  # fmt: skip
    assert deepspeed[7:9] == ["--master_port", "29500"]
    assert (tmp_path / "hostfile").read_text() == "10.213.0.2 slots=2\n10.213.0.3 slots=2\n"


@pytest.mark.parametrize("planted", [False, True])
def test_a_script_is_never_readable_by_others_while_it_is_written(
    tmp_path: Path, planted: bool
) -> None:
    """`write_file_command` (launch.sh holds the spec's env values, secrets among them): the
    text goes into a file only its owner can read, which gets the script's mode once whole.
    A symlink left where the file is written is not followed."""
    run = tmp_path / "home/orch-jobs/j/run"
    run.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    if planted:
        (run / "launch.sh.tmp").symlink_to(elsewhere)
    writer = subprocess.Popen(
        ["bash", "-c", file_write.write_file_command("orch-jobs/j/run/launch.sh", "0700")],
        stdin=subprocess.PIPE, env={**os.environ, "HOME": str(tmp_path / "home")}, umask=0o022,
    )  # fmt: skip
    assert writer.stdin is not None
    writer.stdin.write(b"export SECRET=hunter2\n")
    writer.stdin.flush()  # half written: the writer waits for the rest

    def being_written() -> list[Path]:
        return [p for p in run.iterdir() if not p.is_symlink() and p.stat().st_size > 0]

    try:
        wait_until(being_written, "the script half written in its folder", timeout=10)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in being_written()}
        assert all(mode & 0o077 == 0 for mode in modes.values()), modes
    finally:
        writer.stdin.close()
        assert writer.wait(timeout=10) == 0
    script = run / "launch.sh"
    assert script.read_text() == "export SECRET=hunter2\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o700
    assert elsewhere.read_text() == "untouched"
    assert sorted(p.name for p in run.iterdir()) == ["launch.sh"] + ["launch.sh.tmp"] * planted
