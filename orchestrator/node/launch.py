"""Pure builders for starting a job on its nodes: paths, environment, the node launch script.

Nothing here does I/O. The controller sends `launch_script(...)` to each node and starts it
detached (`start_command`), so training goes on when the SSH connection or the controller dies.

On every node, under the home directory:

    orch-jobs/<job id>/workdir/        the synced workdir (the run command's cwd)
    orch-jobs/<job id>/run/launch.sh   the script below
    orch-jobs/<job id>/run/node.log    torchrun's output, lines prefixed `[default<local rank>]:`
    orch-jobs/<job id>/run/pid         pid of the detached launch script
    orch-jobs/<job id>/run/exit_code   written (atomically) when torchrun has exited
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.node import container
from orchestrator.node.run_progress import SETUP_DONE, SETUP_RUNNING

DEFAULT_MASTER_PORT = 29500
SETUP_FAILED_EXIT = 97  # exit code recorded when the spec's `setup` command fails


@dataclass(frozen=True)
class NodeLayout:
    """Where a job's files live on a node, as paths relative to the node's home."""

    job_id: str

    @property
    def root(self) -> str:
        return f"orch-jobs/{self.job_id}"

    @property
    def workdir(self) -> str:
        return f"{self.root}/workdir"

    @property
    def run_dir(self) -> str:
        return f"{self.root}/run"

    @property
    def log(self) -> str:
        return f"{self.run_dir}/node.log"

    @property
    def default_checkpoint_dir(self) -> str:
        return f"{self.root}/checkpoints"

    def node_path(self, path: str | None) -> str:
        """A spec path as seen from the node's home: `~/x` -> `x`, relative -> under workdir.

        Absolute paths stay absolute. None means the job's default checkpoint directory. The
        result is normalised (no `.` or `..` part, no trailing `/`): `.` and `./` name the
        workdir itself, `~` and `~/` the home (`.`), and `ckpt/../..` what it leads to, so a
        path compared with the layout's folders is compared as the node will resolve it
        (symlinks aside: only the node sees those).
        """
        if path is None:
            return self.default_checkpoint_dir
        if path.startswith("/"):
            return "/" + posixpath.normpath(path).lstrip("/")  # POSIX keeps a leading `//`
        if path == "~" or path.startswith("~/"):
            return posixpath.normpath(path[2:] or ".")
        return posixpath.normpath(f"{self.workdir}/{path}")


def home_relative(path: str) -> str:
    """A data destination (`~/x`, `x`: under the home; `/x`: as is) as a node path the way
    `home_expr` takes it, normalised."""
    if path.startswith("/"):
        return "/" + posixpath.normpath(path).lstrip("/")
    if path == "~" or path.startswith("~/"):
        path = path[2:]
    return posixpath.normpath(path or ".")


def home_expr(path: str) -> str:
    """Shell expression for a home-relative (or absolute) node path, safely quoted."""
    if path.startswith("/"):
        return shlex.quote(path)
    return f'"$HOME"/{shlex.quote(path)}'


@dataclass(frozen=True)
class NodeLaunch:
    """Everything that differs between nodes of one launch."""

    node_rank: int
    interface: str  # network interface for gloo/NCCL sockets
    runtime: container.ContainerRuntime | None = None  # how the node runs the job's container
    gpu_indices: tuple[int, ...] | None = None  # the machine's GPUs this node may use (an
    #                                             allocation on a shared machine); None: all


@dataclass(frozen=True)
class ClusterLaunch:
    """What is common to every node of one launch of a job."""

    job_id: str
    run: str  # the user's command, run under torchrun on every node
    setup: str | None
    num_nodes: int
    procs_per_node: int
    master_addr: str
    master_port: int
    node_ips: Sequence[str]
    checkpoint_dir: str  # home-relative or absolute (NodeLayout.node_path)
    resume_from: str = ""  # home-relative or absolute path of the checkpoint to resume from
    user_env: Mapping[str, str] = ()  # type: ignore[assignment]
    launcher: str = "torchrun"  # torchrun: orch starts `run` under torchrun; none: as written
    node_owner: str = ""  # whose directories the nodes hold: a kept cluster's id, or the job's
    # On a kept cluster: the digest of `setup` and the files it names (`setup_digest`); a node
    # whose last setup that succeeded had the same one skips it.
    setup_key: str | None = None
    container: container.ContainerJob | None = None  # None: on the bare node

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.node_owner or self.job_id)


def orch_environment(cluster: ClusterLaunch, node: NodeLaunch) -> dict[str, str]:
    """ORCH_* variables of DESIGN.md, SkyPilot's names for the same facts (so a task written
    for it runs unchanged), and the socket interface, as plain values. With `launcher: none`
    also MASTER_ADDR, MASTER_PORT and NODE_RANK, which the run's own launcher reads (torchrun
    sets its workers' own).

    ORCH_CHECKPOINT_DIR and ORCH_RESUME_FROM are home-relative here; `launch_script` turns them
    into absolute paths on the node.

    A node with `gpu_indices` (its share of a machine's GPUs) gets CUDA_VISIBLE_DEVICES and
    NVIDIA_VISIBLE_DEVICES (read by container runtimes) set to them, over any the user gave:
    the run sees those GPUs only, as its local ranks 0..n-1.
    """
    own_launcher = (
        {
            "MASTER_ADDR": cluster.master_addr,
            "MASTER_PORT": str(cluster.master_port),
            "NODE_RANK": str(node.node_rank),
        }
        if cluster.launcher == "none"
        else {}
    )
    return {
        **own_launcher,
        "SKYPILOT_NODE_RANK": str(node.node_rank),
        "SKYPILOT_NODE_IPS": "\n".join(cluster.node_ips),
        "SKYPILOT_NUM_NODES": str(cluster.num_nodes),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(cluster.procs_per_node),
        "ORCH_JOB_ID": cluster.job_id,
        "ORCH_NODE_RANK": str(node.node_rank),
        "ORCH_NUM_NODES": str(cluster.num_nodes),
        "ORCH_GPUS_PER_NODE": str(cluster.procs_per_node),
        "ORCH_MASTER_ADDR": cluster.master_addr,
        "ORCH_MASTER_PORT": str(cluster.master_port),
        "ORCH_NODE_IPS": ",".join(cluster.node_ips),
        "GLOO_SOCKET_IFNAME": node.interface,
        "NCCL_SOCKET_IFNAME": node.interface,
        **gpu_visibility(node.gpu_indices),
    }


def gpu_visibility(indices: Sequence[int] | None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES naming exactly `indices` (the
    machine's GPU indices, in order); nothing for None (every GPU of the machine)."""
    if indices is None:
        return {}
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in indices):
        raise ValueError(f"GPU indices must be whole numbers >= 0, not {list(indices)!r}")
    value = ",".join(str(i) for i in indices)
    return {"CUDA_VISIBLE_DEVICES": value, "NVIDIA_VISIBLE_DEVICES": value}


def torchrun_args(cluster: ClusterLaunch, node: NodeLaunch) -> list[str]:
    """torchrun's arguments for one node: static rendezvous at node 0, per-rank output teed
    to the node log with a `[default<local rank>]:` prefix. `--log-dir` is added by the script.
    """
    return [
        f"--nnodes={cluster.num_nodes}",
        f"--nproc_per_node={cluster.procs_per_node}",
        f"--node_rank={node.node_rank}",
        f"--master_addr={cluster.master_addr}",
        f"--master_port={cluster.master_port}",
        "--redirects=3",
        "--tee=3",
        "--no-python",
        "bash",
        "-c",
        cluster.run,
    ]


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def launch_script(cluster: ClusterLaunch, node: NodeLaunch) -> str:
    """The bash script that runs the job on one node and records its exit code: torchrun's,
    or with `launcher: none` that of `run` itself; with a container, the container's.

    Every user-supplied value is quoted with shlex; none is pasted into the script raw.
    """
    layout = cluster.layout
    finish_lines = [
        "finish() {",
        '  echo "$1" > "$run_dir/exit_code.tmp" && mv -f "$run_dir/exit_code.tmp" '
        '"$run_dir/exit_code"',
        '  exit "$1"',
        "}",
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"# orch job {cluster.job_id}, node {node.node_rank} of {cluster.num_nodes}",
        "set -u",
        f"run_dir={home_expr(layout.run_dir)}",
        *finish_lines,
        f"cd {home_expr(layout.workdir)} || finish {SETUP_FAILED_EXIT}",
        # SIGTERM reaches the whole session; this script must outlive it to record torchrun's
        # exit once the trainers have checkpointed (a trap, unlike ignoring the signal, is
        # not inherited by torchrun).
        "trap 'true' TERM",
    ]
    if cluster.container is None:
        environment = _export_lines({**dict(cluster.user_env), **orch_environment(cluster, node)})
        return "\n".join(lines + environment + _job_lines(cluster, node)) + "\n"
    if node.runtime is None:
        raise ValueError("a container job needs the node's container runtime")
    job = cluster.container
    launch = container.ContainerLaunch(
        image=job.image,
        runtime=node.runtime,
        name=container.container_name(layout.job_id, cluster.job_id, node.node_rank, job.start),
        mounts=sorted({home_expr(layout.root), *(home_expr(p) for p in job.mounts)}),
        shm_size=job.shm_size,
        devices=job.devices,
        volumes=job.volumes,
    )
    environment = "".join(
        line + "\n"
        for line in _export_lines({**dict(cluster.user_env), **orch_environment(cluster, node)})
    )
    inner = [
        "set -u",
        f"run_dir={home_expr(layout.run_dir)}",
        *finish_lines,
        f'. "$run_dir/{container.ENV_FILE}"',
        f"cd {home_expr(layout.workdir)} || finish {SETUP_FAILED_EXIT}",
        *_job_lines(cluster, node, in_container=True),
    ]
    lines += [
        f'(umask 077 && printf %s {shlex.quote(environment)} > "$run_dir/{container.ENV_FILE}")'
        f" || finish {SETUP_FAILED_EXIT}",
        f"printf '%s\\n' {shlex.quote(chr(10).join(inner))} > \"$run_dir/{container.INNER_SCRIPT}\""
        f" || finish {SETUP_FAILED_EXIT}",
        *container.container_lines(launch, home_expr(layout.workdir)),
    ]
    return "\n".join(lines) + "\n"


def _export_lines(variables: Mapping[str, str]) -> list[str]:
    lines = []
    for name, value in variables.items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
        lines.append(f"export {name}={shlex.quote(value)}")
    return lines


def _job_lines(
    cluster: ClusterLaunch, node: NodeLaunch, *, in_container: bool = False
) -> list[str]:
    """The job's own lines after its variables: settings, setup, then the run and `finish`
    with its exit code. In a container the run goes in the background and a TERM to the
    script (from the container's init) is handed to it once; on the node, TERM reaches the
    whole session already."""
    lines = [
        # torchrun tees the ranks' output through its own stdout, a file here: unbuffered,
        # lines reach node.log (and the controller's live view) as they are printed.
        "export PYTHONUNBUFFERED=1"
    ]
    if cluster.launcher == "torchrun" and cluster.procs_per_node > 1:
        # What torchrun does itself, without its banner on every node: one OpenMP thread a
        # process unless the job or the node says otherwise (set, even empty, is kept).
        lines.append('export OMP_NUM_THREADS="${OMP_NUM_THREADS-1}"')
    lines.append(f"export ORCH_CHECKPOINT_DIR={home_expr(cluster.checkpoint_dir)}")
    resume = home_expr(cluster.resume_from) if cluster.resume_from else "''"
    lines.append(f"export ORCH_RESUME_FROM={resume}")
    lines.append('mkdir -p "$ORCH_CHECKPOINT_DIR"')
    if cluster.setup:
        lines += setup_lines(cluster.setup, cluster.setup_key, cluster.layout)
    if cluster.launcher == "none":
        run = f"bash -c {shlex.quote(cluster.run)}"
    else:
        run = 'torchrun --log-dir="$run_dir/ranks" ' + shlex.join(torchrun_args(cluster, node))
    if not in_container:
        return [*lines, run, 'finish "$?"']
    return [
        *lines,
        f"{run} &",
        "child=$!",
        """trap 'kill -TERM "$child" 2>/dev/null' TERM""",
        # a wait that the trap interrupts returns early: wait again while the run lives, and
        # keep the status of the wait that saw it end (bash's answer to a wait for a process
        # already waited for is no exit status)
        'wait "$child"; code=$?',
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done',
        'finish "$code"',
    ]


def setup_lines(setup: str, key: str | None, layout: NodeLayout) -> list[str]:
    """Run `setup`; with a `key`, only on a node whose last successful setup had another."""
    run = [
        f'echo "{SETUP_RUNNING}"',
        f"bash -c {shlex.quote(setup)} || {{",
        f'  code=$?; echo "[orch] setup failed with exit code $code"; finish {SETUP_FAILED_EXIT}',
        "}",
        f'echo "{SETUP_DONE}"',  # the start's clock begins here (see run_progress)
    ]
    if key is None:
        return run
    marker = home_expr(f"{layout.root}/setup.key")
    return [
        f'if [ "$(cat {marker} 2>/dev/null)" = {shlex.quote(key)} ]; then',
        '  echo "[orch] setup: unchanged since it last ran on this node, skipped"',
        "else",
        f"  rm -f {marker}",
        *(f"  {line}" for line in run),
        f"  echo {shlex.quote(key)} > {marker}",
        "fi",
    ]


def rerun_command(layout: NodeLayout) -> str:
    """Shell command that readies a node which survived the loss of a peer for the run's
    restart: what is left of its run (the whole session) and its checkpoint agent are killed,
    and their state cleared. The run's log stays, and the restart appends to it (the
    controller's copy goes on from where it was). The checkpoint directory and the workdir
    stay: the restart uses the checkpoint files the node holds where they are."""
    agent = home_expr(f"{layout.root}/checkpoint-agent")
    run_dir = home_expr(layout.run_dir)
    return "\n".join(
        [
            stop_command(layout, "KILL"),  # the container too, if the run has one
            f'[ -f {agent}/pid ] && kill -KILL "$(cat {agent}/pid)" 2>/dev/null',
            f"rm -rf {agent}",
            f"[ -d {run_dir} ] && find {run_dir} -mindepth 1 -maxdepth 1 ! -name node.log "
            "-exec rm -rf {} +",
            "true",
        ]
    )


def start_command(layout: NodeLayout) -> str:
    """Shell command that starts launch.sh detached (own session, no tty, output appended to
    node.log: a restart on a node that stayed through a recovery goes on in the same log).

    Prints the pid of the detached script. Refuses to start twice: a second call while a run
    is recorded fails with exit code 3 (so a retried start never launches the job twice).
    """
    run_dir = home_expr(layout.run_dir)
    return "\n".join(
        [
            f"cd {run_dir} || exit 2",
            "if [ -e pid ]; then echo already started >&2; exit 3; fi",
            "rm -f exit_code exit_code.tmp",
            "setsid nohup bash launch.sh >> node.log 2>&1 < /dev/null &",
            "pid=$!",
            "echo $pid > pid.tmp && mv pid.tmp pid && echo $pid",
        ]
    )


# --- status probe -------------------------------------------------------------------------

PROBE_MARK = "@@orch-probe@@"
PROBE_LOG_LIMIT = 1048576  # bytes of new log one probe returns at most


def probe_command(layout: NodeLayout, log_offset: int | None) -> str:
    """One command per node and tick: the run's state, then (optionally) new bytes of node.log.

    Output: `<PROBE_MARK> running|exit <code>|vanished|not-started <log size>` then the log bytes
    from `log_offset` (at most 1 MiB) when an offset is given.
    """
    run_dir = home_expr(layout.run_dir)
    status = (
        f"cd {run_dir} 2>/dev/null || {{ echo '{PROBE_MARK} not-started 0'; exit 0; }}; "
        "touch heartbeat; "  # the controller is alive: see orchestrator.node.guard
        "size=$(stat -c %s node.log 2>/dev/null || echo 0); "
        f'if [ -f exit_code ]; then echo "{PROBE_MARK} exit $(cat exit_code) $size"; '
        f'elif [ ! -f pid ]; then echo "{PROBE_MARK} not-started $size"; '
        # A zombie (state Z) has exited, though `kill -0` still finds it.
        'elif state=$(sed "s/.*) //" /proc/"$(cat pid)"/stat 2>/dev/null | cut -c1) && '
        f'[ -n "$state" ] && [ "$state" != Z ]; then echo "{PROBE_MARK} running $size"; '
        f'else echo "{PROBE_MARK} vanished $size"; fi'
    )
    if log_offset is None:
        return status
    tail = f"tail -c +{int(log_offset) + 1} node.log 2>/dev/null | head -c {PROBE_LOG_LIMIT}"
    return f"{status}; {tail}"


@dataclass(frozen=True)
class NodeProbe:
    """Parsed answer of `probe_command`."""

    state: str  # running | exited | vanished | not-started
    exit_code: int | None
    log_size: int
    new_log: str


def parse_probe(output: str) -> NodeProbe:
    """Parse a probe's output; an unreadable answer counts as `vanished` (the caller confirms)."""
    head, _, rest = output.partition("\n")
    parts = head.split()
    if len(parts) < 3 or parts[0] != PROBE_MARK:
        return NodeProbe("vanished", None, 0, "")
    state = parts[1]
    try:
        if state == "exit":
            return NodeProbe("exited", int(parts[2]), int(parts[3]), rest)
        return NodeProbe(state, None, int(parts[2]), rest)
    except (ValueError, IndexError):
        return NodeProbe("vanished", None, 0, "")


FREE_PORT_SCRIPT = """
import socket, sys
def free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", port))
        return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
preferred = int(sys.argv[1])
print(free(preferred) or free(0))
"""


def free_port_command(preferred: int = DEFAULT_MASTER_PORT) -> str:
    """Command printing `preferred` if it can be bound on the node, else a free port."""
    return shlex.join(["python3", "-c", FREE_PORT_SCRIPT, str(preferred)])


def stop_command(layout: NodeLayout, signal: str = "TERM") -> str:
    """Send `signal` to the detached run (its whole session) on a node; no-op when not running.

    A run in a container hears TERM through its runtime (see `container.container_lines`); a
    KILL also removes the container, which does not live in the run's session."""
    run_dir = home_expr(layout.run_dir)
    command = (
        f"cd {run_dir} 2>/dev/null && [ -f pid ] && pid=$(cat pid) && "
        f'kill -{shlex.quote(signal)} -- -"$pid" 2>/dev/null; true'
    )
    if signal == "KILL":
        command += f"; {container.kill_command(run_dir)}"
    return command
