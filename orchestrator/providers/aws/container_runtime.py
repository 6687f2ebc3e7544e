"""How an EC2 node runs a job's container image, and what readies it at boot. Pure.

- `ec2_runtime`: Docker through `sudo -n`, every GPU (`--gpus all`) on an instance type the
  catalog lists with GPUs. Its `prepare` (run before a node's first pull) waits for the boot
  setup below to end and checks that Docker answers; when it does not, it prints the end of the
  setup's log, which the pull's failure message then shows.
- `setup_parts`: the cloud-config entries (`write_files`, `runcmd`) of a launch for a job with
  a container: a script that installs, from the package sources the node image already has
  (apt-get, dnf or yum), whatever of these is missing: Docker (`docker` on the PATH), on GPU
  nodes the NVIDIA container toolkit (`nvidia-ctk`, then Docker's runtime configured with it
  and Docker restarted), and the AWS CLI (`aws`, for Amazon ECR logins). Images that have them
  (the Deep Learning AMIs) install nothing. What it does goes to `SETUP_LOG` (and, as all boot
  output, to cloud-init's own log); its end is marked in `SETUP_DONE` with 0 or 1.
- `local_cloud_runtime`: the hosts of a cloud on this machine (`orch sandbox aws`, moto) run
  this machine's software, so they run containers as local nodes do (rootful podman, no
  daemon, on the host's network; `orchestrator.providers.local.containers`) and get no boot
  setup, which would install packages on this machine. Their storage is under the host's
  HOME (its own disk), their runtime state on a tmpfs at `LOCAL_CLOUD_RUNROOT`, mounted in the
  host's own mount namespace (HOME's path is too long for podman's runroot).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.node.container import ContainerRuntime
from orchestrator.providers.local.containers import local_runtime

SETUP_DIR = "/opt/orch-container"
SETUP_SCRIPT = f"{SETUP_DIR}/setup.sh"
SETUP_DONE = f"{SETUP_DIR}/done"  # "0" or "1" (something missing) once the setup has ended
SETUP_LOG = "/var/log/orch-container-setup.log"
SETUP_WAIT_S = 1500  # how long a pull waits for the boot setup to end
GPU_OPTIONS = ("--gpus", "all")
LOCAL_CLOUD_BASE = '"$HOME"/.orch-containers'  # shell text: the host's own disk
LOCAL_CLOUD_RUNROOT = "/run/orch-sandbox-podman"  # a tmpfs of each host's own

# The script written to SETUP_SCRIPT: $1 is 1 on a GPU node, $2 the file that marks its end.
# Each `want COMMAND PACKAGE...` installs the first package that brings COMMAND, unless COMMAND
# is there already.
SETUP_TEXT = r"""#!/bin/sh
gpu=$1 done_file=$2 failed=0 changed=0 t0=$(date +%s)
say() { echo "orch container setup: $*"; }
have() { command -v "$1" >/dev/null 2>&1; }
if have apt-get; then
  export DEBIAN_FRONTEND=noninteractive
  add() { [ -n "$listed" ] || { apt-get update -q; listed=1; }; apt-get install -y -q "$1"; }
  docker_pkg=docker.io cli_pkgs=awscli
elif have dnf || have yum; then
  add() { $(have dnf && echo dnf || echo yum) install -y -q "$1"; }
  docker_pkg=docker cli_pkgs="awscli-2 awscli"
else
  add() { say "no apt-get, dnf or yum in this image"; return 1; }
fi
want() {
  c=$1; shift
  if have "$c"; then say "$c: present"; return 0; fi
  for p in "$@"; do
    say "installing $p (for $c)"; add "$p" && have "$c" && { changed=1; return 0; }
  done
  [ "$c" = aws ] && have snap && snap install aws-cli --classic && have aws && return 0
  say "FAILED: no $c; use a node image that has it"; failed=1; return 1
}
say "start $(date -u +%Y-%m-%dT%H:%M:%SZ)"
want docker $docker_pkg && { systemctl enable --now docker || failed=1; }
if [ "$gpu" = 1 ]; then
  have nvidia-container-toolkit || want nvidia-ctk nvidia-container-toolkit
  if [ $changed = 1 ] && have nvidia-ctk && have docker; then
    nvidia-ctk runtime configure --runtime=docker && systemctl restart docker || failed=1
  fi
fi
want aws $cli_pkgs
say "end after $(( $(date +%s) - t0 )) s: $([ $failed = 0 ] && echo ready || echo FAILED)"
echo $failed > "$done_file"
"""


# A node launched with the setup holds SETUP_SCRIPT from cloud-init's first stage (the one
# that also installs the host key orch pins), so a pull can tell that a setup is coming.
_PREPARE = (
    f"w=0; while [ -e {SETUP_SCRIPT} ] && [ ! -e {SETUP_DONE} ] && [ $w -lt {SETUP_WAIT_S} ]; "
    "do sleep 2; w=$((w+2)); done; "
    f"sudo -n docker info >/dev/null 2>&1 || {{ tail -n 6 {SETUP_LOG} 2>/dev/null; "
    f'echo "docker does not answer on this node (boot setup: {SETUP_LOG})"; false; }}'
)


def ec2_runtime(*, gpu: bool) -> ContainerRuntime:
    """The runtime of an EC2 node: Docker through `sudo -n`, `--gpus all` when `gpu`."""
    return ContainerRuntime(
        kind="docker",
        command="sudo -n docker",
        prepare=_PREPARE,
        gpu_options=GPU_OPTIONS if gpu else (),
    )


def setup_parts(*, gpu: bool) -> dict[str, list]:
    """The cloud-config entries that ready a node for a job's container at boot (see the
    module docstring); `gpu`: the NVIDIA container toolkit too."""
    run = (
        f"PATH=$PATH:/usr/local/bin:/snap/bin sh {SETUP_SCRIPT} {1 if gpu else 0} {SETUP_DONE} "
        f"2>&1 | tee -a {SETUP_LOG}"
    )
    return {
        "write_files": [{"path": SETUP_SCRIPT, "permissions": "0755", "content": SETUP_TEXT}],
        "runcmd": [["sh", "-c", run]],
    }


def local_cloud_runtime(insecure_registries: Sequence[str] = ()) -> ContainerRuntime:
    """The runtime of a host of a cloud on this machine (see the module docstring): podman,
    plain HTTP to `insecure_registries` only."""
    return local_runtime(insecure_registries, base=LOCAL_CLOUD_BASE, runroot=LOCAL_CLOUD_RUNROOT)
