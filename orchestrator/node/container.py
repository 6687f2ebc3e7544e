"""Pure builders for running a job's `setup` and `run` in its container image on a node.

Nothing here does I/O. Each node runs containers with the runtime its provider names
(`ContainerRuntime`: Docker on EC2, podman on local nodes). Per job and node:

- `pull_script` logs in (the password read from standard input, kept in a per-job auth file
  that the script removes), pulls the image unless it is there and `pull: missing`, prints
  progress lines (`PULL_MARK ...`, see `parse_pull_line`) and checks that the image holds
  `bash` (and `torchrun`, under the default launcher);
- `container_lines` are the launch script's lines that start the container in the
  foreground of the node's run session: the node's network, host IPC (or an own /dev/shm of
  `shm_size`), the node's locked-memory, stack, open-file and process limits, every GPU on a
  GPU node, the job's directories mounted at the paths the job sees, the environment read
  from a 0600 file (never a command line). A TERM to the run's session reaches the container
  once, through the runtime (`kill`), whose init hands it to the inner script, which hands it
  to the run; the inner script records the run's exit code in the mounted run directory, and
  the launch script ends only once the container has;
- `kill_command` removes the container when its session was killed (a restart, a kept
  cluster's next job), since the container does not live in that session.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

PULL_MARK = "@@orch-pull@@"
ENV_FILE = "container.env"  # in the run directory, 0600: `export NAME='value'` lines
INNER_SCRIPT = "inner.sh"  # in the run directory: what runs inside the container
KILL_SCRIPT = "container.kill"  # in the run directory: removes this run's container
PULL_TIMEOUT_S = 3600.0  # a pull that has not ended by then is a failure
NET_COUNTERS = "/proc/net/dev"  # the node's received bytes, per interface
CHECKS_DIR = ".orch-image-checks"  # in the node's home: the image checks it passed
BASH_MISSING_EXIT = 3
TORCHRUN_MISSING_EXIT = 4


@dataclass(frozen=True)
class ContainerRuntime:
    """How a node runs containers; the provider's choice, the same on every node of a job.

    `command` is shell text that invokes the runtime with its global options (`sudo -n
    docker`, or podman with its storage under the node's home); `prepare` is shell text the
    node runs before its first pull (idempotent; empty: nothing). `run_options` are added to
    every `run` (a node's own needs: an OCI runtime, an init binary); `gpu_options` too, which
    the provider leaves empty on a node without GPUs. `insecure_registries` are the registry
    addresses this runtime may reach over plain HTTP (podman: `--tls-verify=false` for those
    alone)."""

    kind: Literal["docker", "podman"]
    command: str
    prepare: str = ""
    run_options: tuple[str, ...] = ()
    gpu_options: tuple[str, ...] = ()
    insecure_registries: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerJob:
    """What is common to a job's containers on every node of one start."""

    image: str
    mounts: Sequence[str]  # node paths (home-relative or absolute) mounted at the same path
    shm_size: str | None = None
    devices: Sequence[str] = ()
    volumes: Sequence[str] = ()  # HOST:CONTAINER[:ro] from the spec
    start: int = 0  # the job's start number: a new container name for each start


@dataclass(frozen=True)
class ContainerLaunch:
    """What the launch script needs to run one job's container on one node."""

    image: str
    runtime: ContainerRuntime
    name: str  # the container's name: unique per job, rank and start
    mounts: Sequence[str]  # shell expressions of absolute node paths, mounted at the same path
    shm_size: str | None = None
    devices: Sequence[str] = ()
    volumes: Sequence[str] = ()  # HOST:CONTAINER[:ro] from the spec


_NAME_RE = re.compile(r"[^a-zA-Z0-9_.-]")


def container_name(owner: str, job_id: str, rank: int, start: int) -> str:
    """`orch-<owner>-<job>-r<rank>-s<start>`, made of the characters a runtime accepts."""
    text = f"orch-{owner}" + (f"-{job_id}" if job_id != owner else "") + f"-r{rank}-s{start}"
    return _NAME_RE.sub("-", text)[:120]


# --- pull -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullPlan:
    """What `pull_script` does on a node."""

    image: str
    registry: str | None  # host[:port] of the image's registry (None: the runtime's default)
    runtime: ContainerRuntime
    auth_dir: str  # shell expression of a per-job directory for the login's auth file
    always: bool = False  # pull even when the node has the image
    username: str | None = None  # with a password on standard input: log in first
    ecr_region: str | None = None  # log in to Amazon ECR with the node's instance role
    needs_torchrun: bool = True  # the default launcher runs the image's torchrun


def _tls(plan: PullPlan) -> list[str]:
    insecure = plan.registry is not None and plan.registry in plan.runtime.insecure_registries
    return ["--tls-verify=false"] if insecure and plan.runtime.kind == "podman" else []


def _auth(plan: PullPlan) -> tuple[str, str]:
    """(global options, subcommand options) that point the runtime at the per-job auth."""
    if plan.runtime.kind == "docker":
        return '--config "$auth"', ""
    return "", '--authfile "$auth/auth.json"'


def pull_script(plan: PullPlan) -> str:
    """The shell script one node runs to have the image: output lines as `PullProgress.feed`
    reads them, the runtime's own lines between, and an exit code of 0 only when the image is
    there and fit to run. With `username` set, the first line of standard input is the
    registry password; it goes from the shell's memory to the runtime's standard input."""
    rt = plan.runtime.command
    image = shlex.quote(plan.image)
    glob, sub = _auth(plan)
    tls = " ".join(_tls(plan))
    lines = [
        "set -u",
        f"auth={plan.auth_dir}",
        'rm -rf "$auth" && mkdir -p "$auth" && chmod 700 "$auth" || exit 1',
        "trap 'rm -rf \"$auth\"' EXIT",
    ]
    if plan.runtime.prepare:
        failed = f"{{ echo '{PULL_MARK} prepare-failed'; exit 1; }}"
        lines.append(f"{{ {plan.runtime.prepare.strip()} ; }} || {failed}")
    # the image's id, when the node has it: a check it passed there is not run again
    present = f"id=$({rt} image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null)"
    lines.append(f"if {'false' if plan.always else present}; then echo '{PULL_MARK} present'; else")
    # a present image needs no login (`pull: missing`): the registry is asked nothing
    lines += ["  id=", *(f"  {line}" for line in _login_lines(plan))]
    lines += [
        # bytes the node received while pulling: its network counters, sampled every second
        # printf: mawk prints a sum past 2**31 as 3e+09, which the shell cannot subtract
        '  rx() { awk \'NR>2 && $1 != "lo:" {split($0, f, ":"); split(f[2], v, " "); '
        f'n += v[1]}} END {{printf "%.0f\\n", n}}\' {NET_COUNTERS}; }}',
        "  start=$(rx)",
        f"  {rt} {glob} pull {sub} {tls} {image} 2>&1 &",
        "  child=$!",
        "  pause=0.2",  # a quick pull (a small layer, a refusal) is not held a whole second
        "  while kill -0 $child 2>/dev/null; do",
        f'    echo "{PULL_MARK} bytes $(( $(rx) - start ))"; sleep $pause; pause=1',
        "  done",
        "  wait $child; code=$?",
        f'  echo "{PULL_MARK} bytes $(( $(rx) - start ))"',
        f'  [ "$code" = 0 ] || {{ echo "{PULL_MARK} pull-failed $code"; exit 1; }}',
        f"  echo '{PULL_MARK} pulled'",
        f"  id=$({rt} image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null)",
        "fi",
    ]
    check = f"command -v bash >/dev/null || exit {BASH_MISSING_EXIT}"
    if plan.needs_torchrun:
        check += f"; command -v torchrun >/dev/null || exit {TORCHRUN_MISSING_EXIT}"
    # the run's own options, GPUs included: a GPU node whose runtime cannot give them fails here
    options = (*plan.runtime.run_options, *plan.runtime.gpu_options)
    opts = " ".join(shlex.quote(o) for o in options)
    # a check this node passed for this image id, options and check is remembered (a starting
    # container costs a second on a loaded node; a kept cluster's next job skips it)
    key = shlex.quote(f" {opts} {check}")
    lines += [
        *_limits_lines(),
        'id=$(printf %s "${id:-}" | tr -cd "a-zA-Z0-9:")',
        f'passed="$HOME/{CHECKS_DIR}/$(printf %s "$id"{key} | cksum | tr -cd "0-9 " | tr " " -)"',
        'if [ -n "$id" ] && [ -f "$passed" ]; then code=0; else',
        f"{rt} run --rm --network host {opts} $limits --entrypoint /bin/sh {image} "
        f"-c {shlex.quote(check)} 2>&1; code=$?",
        f'[ "$code" = 0 ] && [ -n "$id" ] && mkdir -p "$HOME/{CHECKS_DIR}" && touch "$passed"',
        "fi",
        f'echo "{PULL_MARK} checked $code"',
        '[ "$code" = 0 ]',
    ]
    return "\n".join(lines) + "\n"


def _login_lines(plan: PullPlan) -> list[str]:
    """The pull's login (indented, in the script's pull branch): with `username`, the
    password from standard input's first line; for ECR, the node role's."""
    rt, registry = plan.runtime.command, shlex.quote(plan.registry or "")
    glob, sub = _auth(plan)
    tls = " ".join(_tls(plan))
    if plan.username is not None:
        return [
            "IFS= read -r password || password=",
            f'printf %s "$password" | {rt} {glob} login {sub} {tls} '
            f"--username {shlex.quote(plan.username)} --password-stdin {registry} "
            f"|| {{ echo '{PULL_MARK} login-failed'; exit 1; }}",
            "unset password",
        ]
    if plan.ecr_region is not None:
        return [
            f"aws ecr get-login-password --region {shlex.quote(plan.ecr_region)} | "
            f"{rt} {glob} login {sub} --username AWS --password-stdin {registry} "
            f"|| {{ echo '{PULL_MARK} login-failed'; exit 1; }}"
        ]
    return []


@dataclass
class PullProgress:
    """What the lines of one node's pull said so far."""

    layers_total: int = 0
    layers_done: int = 0
    bytes_received: int = 0
    present: bool = False  # the node had the image: nothing pulled
    pulled: bool = False
    failure: str | None = None  # prepare-failed, login-failed, pull-failed, checked
    check_code: int | None = None  # the image check's exit code
    output: list[str] = field(default_factory=list)  # the runtime's own lines (last 40)

    def feed(self, line: str) -> None:
        """Take one line of the pull script's output (bounded by the caller)."""
        if line.startswith(PULL_MARK):
            parts = line[len(PULL_MARK) :].split()
            word = parts[0] if parts else ""
            number = _int(parts[1]) if len(parts) > 1 else None
            if word == "bytes" and number is not None:
                self.bytes_received = max(self.bytes_received, number)
            elif word == "present":
                self.present = True
            elif word == "pulled":
                self.pulled = True
                self.layers_done = max(self.layers_done, self.layers_total)
            elif word == "checked":
                self.check_code = number
                if number != 0:
                    self.failure = "checked"
            elif word in ("prepare-failed", "login-failed", "pull-failed"):
                self.failure = word
            return
        self.output = [*self.output[-39:], line]
        text = line.strip()
        # docker: "<layer>: Pulling fs layer" ... "<layer>: Pull complete"; podman: one
        # "Copying blob <digest>" line per layer, and "done" / "skipped" as each ends
        if text.endswith(": Pulling fs layer") or text.endswith(": Already exists"):
            self.layers_total += 1
        if text.endswith(": Pull complete") or text.endswith(": Already exists"):
            self.layers_done += 1
        if text.startswith("Copying blob "):
            self.layers_total += 1
            if text.endswith(" done") or text.endswith("skipped: already exists"):
                self.layers_done += 1


def _int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


# --- run --------------------------------------------------------------------------------------


def env_file_lines(variables: dict[str, str]) -> str:
    """The 0600 environment file's text: one `export NAME='value'` line per variable."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


def _limits_lines() -> list[str]:
    """Shell lines that set `limits` to the node's hard limits as the runtime's `--ulimit`
    options: a container may not raise a limit above what the node allows, and the runtimes'
    own defaults can be above it."""
    return [
        "lim() { v=$(ulimit -H$1); case $v in unlimited) echo -1;; *) echo $(( v * $2 ));; esac; }",
        "np=$(lim u 1); pm=$(cat /proc/sys/kernel/pid_max)",
        '{ [ "$np" = -1 ] || [ "$pm" -lt "$np" ]; } && np=$pm',
        'limits="--ulimit memlock=$(lim l 1024) --ulimit stack=$(lim s 1024) '
        '--ulimit nofile=$(lim n 1) --ulimit nproc=$np"',
    ]


def run_options(launch: ContainerLaunch) -> list[str]:
    """`run`'s options apart from the limits, the environment file and the image."""
    options = ["--rm", "--name", launch.name, "--network", "host", "--sig-proxy=false"]
    if launch.shm_size:
        options += ["--shm-size", launch.shm_size]
    else:
        options += ["--ipc", "host"]
    options += ["--init", *launch.runtime.run_options]
    options += launch.runtime.gpu_options
    for device in launch.devices:
        options += ["--device", device]
    for volume in launch.volumes:
        options += ["--volume", volume]
    return options


def container_lines(launch: ContainerLaunch, workdir: str) -> list[str]:
    """Launch-script lines (after `run_dir` is set and `finish` defined) that run the inner
    script in the container and `finish` with its exit code. `workdir` is shell text."""
    rt = launch.runtime.command
    name = shlex.quote(launch.name)
    options = " ".join(shlex.quote(o) for o in run_options(launch))
    # the job's own paths: shell expressions ("$HOME"/'x'), so not quoted again
    mounts = " ".join(f"--volume {path}:{path}" for path in launch.mounts)
    kill = f"{rt} rm -f {name} >/dev/null 2>&1; true"
    return [
        *_limits_lines(),
        f"printf '%s\\n' {shlex.quote(kill)} > \"$run_dir/{KILL_SCRIPT}\"",
        f"mkdir -p {' '.join(launch.mounts)} 2>/dev/null; true" if launch.mounts else "true",
        # the client ignores the session's TERM where it can (--sig-proxy=false, and TERM
        # ignored from its start); the trap below hands TERM on once. HOME is given by value:
        # `sudo` (EC2's `sudo -n docker`) resets the client's own to root's
        f"(trap '' TERM; {rt} run {options} {mounts} --env \"HOME=$HOME\" $limits "
        f"--workdir {workdir} --entrypoint /bin/bash "
        f'{shlex.quote(launch.image)} "$run_dir/{INNER_SCRIPT}") &',
        "child=$!",
        # TERM (a cancel, a spot notice, a limit) reaches the container once, through the
        # runtime, whose init hands it to the inner script, which hands it to the run
        f"trap {shlex.quote(f'{rt} kill --signal TERM {name} >/dev/null 2>&1')} TERM",
        'wait "$child"; code=$?',  # interrupted by the trap: wait again while it lives
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done',
        # a client that died anyway leaves the container running: wait for its end
        f"while {rt} inspect --type container {name} >/dev/null 2>&1; do sleep 1; done",
        # the inner script records the run's own exit code (in the mounted run directory);
        # the client's counts only when the container never got that far
        '[ -f "$run_dir/exit_code" ] && exit "$(cat "$run_dir/exit_code")"',
        'finish "$code"',
    ]


def kill_command(run_dir: str) -> str:
    """Shell command that removes the run's container, if the launch script recorded one."""
    return f"[ -f {run_dir}/{KILL_SCRIPT} ] && bash {run_dir}/{KILL_SCRIPT}; true"


# --- messages ---------------------------------------------------------------------------------


def pull_failure(image: str, progress: PullProgress, node: str) -> tuple[str, str]:
    """(message, what to do) for a node's failed pull, from what its runtime said."""
    said = "\n".join(progress.output[-8:]).strip()
    text = said.lower()
    where = f"node {node}"
    if progress.failure == "prepare-failed":
        return (
            f"{where} could not ready its container runtime for {image}:\n{said}",
            "the node needs a working Docker (or podman): check the node image, or run the "
            "job without `container`",
        )
    if progress.failure == "checked":
        if progress.check_code == TORCHRUN_MISSING_EXIT:
            return (
                f"image {image} has no torchrun on its PATH",
                "use an image with PyTorch installed (torchrun comes with it), or set "
                "`launcher: none` and start your processes in `run` (then `setup` may install "
                "what they need)",
            )
        if progress.check_code == BASH_MISSING_EXIT:
            return (
                f"image {image} has no bash, which orch runs `setup` and `run` with",
                "use an image with bash (most are; alpine-based ones lack it)",
            )
        if "nvidia" in text or "gpu" in text or "device driver" in text:
            return (
                f"{where} has GPUs but its container runtime cannot give them to {image}:\n{said}",
                "the node needs the NVIDIA container toolkit: use an image (AMI) with it, or let "
                "orch install it at boot (the default AWS image gets it)",
            )
        return (
            f"a container of {image} did not start on {where}:\n{said}",
            "run the image locally (`docker run --rm -it IMAGE bash`) to see why",
        )
    refused = ("unauthorized", "authentication required", "invalid username/password")
    if progress.failure == "login-failed" or any(word in text for word in refused):
        return (
            f"{where} was refused by the registry of {image} (wrong credentials):\n{said}",
            "check container.credentials.username and the secret its password_secret names "
            "(its value comes from your shell); for Amazon ECR, the node role's ECR read access",
        )
    if any(w in text for w in ("manifest unknown", "not found", "does not exist", "name unknown")):
        return (
            f"image {image} does not exist in its registry:\n{said}",
            "check the repository and tag (a typo, or a tag not pushed yet)",
        )
    return (
        f"{where} could not pull {image}:\n{said}",
        "check that the registry is reachable from the nodes and the reference is right",
    )
