"""The container launch lines, run by a real bash against a stand-in runtime.

The stand-in (`RUNTIME`) does what `docker run`/`podman run` do for these lines: it runs the
entry script in the foreground under the given environment and records the options, and its
`kill` hands the signal to the container's process. So the tests show the launch script's own
contract: the run's exit code is the container's, a TERM to the run's session reaches the
container exactly once and through the runtime, the environment is in a 0600 file and never on
a command line, and the job's paths are mounted at the paths the job sees.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

from orchestrator.node import container, launch

# A runtime for the launch lines: `run` records its argv, then runs the entry script with bash
# (the image's bash) with default signal handling, as a runtime starts a container, and waits
# for it; `kill` signals that process; `inspect` says whether it runs; `rm` is recorded.
RUNTIME = r"""#!/usr/bin/env bash
state=$FAKE_RUNTIME_STATE
case "$1" in
run)
    printf '%s\n' "$@" > "$state/run-argv"
    name=""
    shift
    while [ $# -gt 0 ]; do
        case "$1" in
        --name) name=$2; shift 2 ;;
        --rm|--init|--sig-proxy=false) shift ;;
        --*) shift 2 ;;
        *) break ;;
        esac
    done
    shift  # the image
    # a container's processes are not in the client's session: a TERM to the run's session
    # reaches them only through `kill`
    setsid env --default-signal=TERM bash "$@" &
    echo $! > "$state/$name.pid"
    wait $!
    ;;
inspect)
    name=${@: -1}
    kill -0 "$(cat "$state/$name.pid" 2>/dev/null)" 2>/dev/null
    ;;
kill)
    echo "$*" >> "$state/kills"
    name=${@: -1}
    kill -TERM "$(cat "$state/$name.pid")"
    ;;
rm)
    echo "$*" >> "$state/removed"
    ;;
esac
"""


def setup_node(tmp_path: Path) -> tuple[Path, dict[str, str], container.ContainerRuntime]:
    state = tmp_path / "runtime"
    state.mkdir()
    program = tmp_path / "runtime.sh"
    program.write_text(RUNTIME)
    program.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "FAKE_RUNTIME_STATE": str(state)}
    # the command as a provider writes it: with a variable for the runtime (podman: TMPDIR)
    runtime = container.ContainerRuntime(kind="docker", command=f"TMPDIR={tmp_path} {program}")
    return home, env, runtime


def container_cluster(run: str, **overrides: object) -> launch.ClusterLaunch:
    base: dict = dict(
        job_id="job-1",
        run=run,
        setup="echo setting-up",
        num_nodes=1,
        procs_per_node=1,
        master_addr="10.213.0.2",
        master_port=29500,
        node_ips=["10.213.0.2"],
        checkpoint_dir="ckpt",
        launcher="none",
        user_env={"SECRET_TOKEN": "s3cr3t value\nsecond line", "PLAIN": "x"},
        container=container.ContainerJob(
            image="registry.example:5000/team/train:1.4", mounts=("data", "/scratch/in")
        ),
    )
    base.update(overrides)
    return launch.ClusterLaunch(**base)


def start(home: Path, env: dict[str, str], script: str) -> subprocess.Popen[str]:
    layout = launch.NodeLayout("job-1")
    (home / layout.workdir).mkdir(parents=True)
    (home / layout.run_dir).mkdir(parents=True, exist_ok=True)
    (home / layout.run_dir / "launch.sh").write_text(script)
    return subprocess.Popen(
        ["bash", str(home / layout.run_dir / "launch.sh")],
        env=env, cwd=home, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_the_runs_exit_code_is_the_containers_and_the_env_is_in_a_private_file(
    tmp_path: Path,
) -> None:
    home, env, runtime = setup_node(tmp_path)
    run = 'echo "token=$SECRET_TOKEN home=$HOME ckpt=$ORCH_CHECKPOINT_DIR"; exit 5'
    script = launch.launch_script(container_cluster(run), launch.NodeLaunch(0, "lo", runtime))
    proc = start(home, env, script)
    output, _ = proc.communicate(timeout=30)
    run_dir = home / "orch-jobs/job-1/run"
    assert (run_dir / "exit_code").read_text().strip() == "5", output
    assert proc.returncode == 5
    assert "token=s3cr3t value\nsecond line" in output  # multi-line values arrive whole
    assert f"home={home} ckpt={home}/ckpt" in output
    assert "setting-up" in output  # setup ran in the container too
    env_file = run_dir / container.ENV_FILE
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    argv = (tmp_path / "runtime" / "run-argv").read_text()
    assert "s3cr3t" not in argv and "s3cr3t" not in (run_dir / container.INNER_SCRIPT).read_text()
    # the node's network and IPC, HOME by name, the job's paths at their own paths
    lines = argv.splitlines()
    assert lines[lines.index("--network") + 1] == "host"
    assert "--ipc" in lines and lines[lines.index("--ipc") + 1] == "host"
    assert lines[lines.index("--env") + 1] == f"HOME={home}"  # by value: sudo resets HOME
    mounts = {lines[i + 1] for i, word in enumerate(lines) if word == "--volume"}
    assert mounts == {
        f"{home}/orch-jobs/job-1:{home}/orch-jobs/job-1",  # workdir, run dir, checkpoints
        f"{home}/data:{home}/data",
        "/scratch/in:/scratch/in",
    }
    for limit in ("memlock=", "stack=", "nofile=", "nproc="):
        assert any(word.startswith(limit) for word in lines), lines


def test_a_term_to_the_session_reaches_the_container_once_through_the_runtime(
    tmp_path: Path,
) -> None:
    home, env, runtime = setup_node(tmp_path)
    run = "trap 'echo checkpointed; exit 7' TERM; echo started; while true; do sleep 0.1; done"
    script = launch.launch_script(container_cluster(run), launch.NodeLaunch(0, "lo", runtime))
    proc = start(home, env, script)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "started" in line:
            break
    os.killpg(proc.pid, signal.SIGTERM)  # what `launch.stop_command` does
    output, _ = proc.communicate(timeout=30)
    run_dir = home / "orch-jobs/job-1/run"
    assert (run_dir / "exit_code").read_text().strip() == "7", output
    assert "checkpointed" in output
    kills = (tmp_path / "runtime" / "kills").read_text().splitlines()
    assert kills == [f"kill --signal TERM {container.container_name('job-1', 'job-1', 0, 0)}"]
    # A KILL of the session cannot reach the container: the recorded removal does.
    subprocess.run(["bash", "-c", launch.stop_command(launch.NodeLayout("job-1"), "KILL")],
                   env=env, check=True, timeout=10)  # fmt: skip
    removed = (tmp_path / "runtime" / "removed").read_text()
    assert removed.startswith("rm -f orch-job-1-r0-s0"), removed


def test_an_image_without_the_nodes_runtime_is_refused() -> None:
    try:
        launch.launch_script(container_cluster("true"), launch.NodeLaunch(0, "lo"))
    except ValueError as exc:
        assert "container runtime" in str(exc)
    else:
        raise AssertionError("a container job started without a runtime")


def test_own_shm_size_turns_host_ipc_off_and_gpu_options_come_from_the_node() -> None:
    runtime = container.ContainerRuntime(
        kind="docker", command="sudo -n docker", gpu_options=("--gpus", "all")
    )
    options = container.run_options(
        container.ContainerLaunch(
            image="img", runtime=runtime, name="n", mounts=(), shm_size="16g",
            devices=("/dev/infiniband",), volumes=("/data:/data:ro",),
        )
    )  # fmt: skip
    assert "--ipc" not in options and options[options.index("--shm-size") + 1] == "16g"
    assert options[options.index("--gpus") + 1] == "all"
    assert options[options.index("--device") + 1] == "/dev/infiniband"
    assert options[options.index("--volume") + 1] == "/data:/data:ro"


def test_container_names_are_runtime_safe() -> None:
    assert container.container_name("c-1", "job 2/x", 3, 17) == "orch-c-1-job-2-x-r3-s17"
    assert container.container_name("job-1", "job-1", 0, 5) == "orch-job-1-r0-s5"
