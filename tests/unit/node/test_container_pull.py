"""The pull script, run by a real bash against a stand-in runtime, and what its lines mean.

The stand-in (`RUNTIME`) answers `login`, `image inspect`, `pull` and `run` the way Docker and
podman do for these commands (their words, their exit codes), driven by files the test writes:
which password the registry takes, whether the image exists or is already on the node, what
the image holds. Its argv are recorded, so the tests see what reached a command line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.node import container

RUNTIME = r"""#!/usr/bin/env bash
state=$FAKE_RUNTIME_STATE
echo "$*" >> "$state/argv"
while [ "${1#--}" != "$1" ]; do shift; [ "${1#--}" = "$1" ] && [ "$1" != login ] && shift; done
case "$1" in
login)
    read -r given
    if [ "$given" = "$(cat "$state/password")" ]; then echo "Login Succeeded!"; exit 0; fi
    echo "Error: logging into \"${@: -1}\": invalid username/password" >&2; exit 125 ;;
image)
    [ -f "$state/present" ] ;;
pull)
    if [ ! -f "$state/exists" ]; then
        echo "Error: initializing source: reading manifest x in y: manifest unknown"; exit 125
    fi
    echo "Trying to pull ${@: -1}..."
    echo "Copying blob sha256:aaa"; echo "Copying blob sha256:bbb"; echo "Copying config sha256:ccc"
    touch "$state/present"; echo "Writing manifest to image destination" ;;
run)
    PATH=$(cat "$state/image-path") /bin/sh -c "${@: -1}" ;;
esac
"""


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, dict[str, str], container.ContainerRuntime]:
    state = tmp_path / "state"
    state.mkdir()
    (state / "password").write_text("right\n")
    (state / "exists").touch()
    image_bin = tmp_path / "image-bin"  # what the image's PATH holds
    image_bin.mkdir()
    for tool in ("bash", "torchrun"):
        (image_bin / tool).write_text("#!/bin/sh\n")
        (image_bin / tool).chmod(0o755)
    (state / "image-path").write_text(str(image_bin))
    program = tmp_path / "runtime.sh"
    program.write_text(RUNTIME)
    program.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "FAKE_RUNTIME_STATE": str(state)}
    return state, env, container.ContainerRuntime(kind="podman", command=str(program))


def plan(runtime: container.ContainerRuntime, **overrides: object) -> container.PullPlan:
    base: dict = dict(
        image="10.213.0.1:5000/team/train:1",
        registry="10.213.0.1:5000",
        runtime=runtime,
        auth_dir='"$HOME"/run/registry-auth',
        username="bot",
    )
    base.update(overrides)
    return container.PullPlan(**base)


def pull(env: dict[str, str], pull_plan: container.PullPlan, password: str = "right"):
    result = subprocess.run(
        ["bash", "-c", container.pull_script(pull_plan)], env=env, input=password + "\n",
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    progress = container.PullProgress()
    for line in result.stdout.splitlines():
        progress.feed(line)
    return result, progress


def test_a_pull_logs_in_from_stdin_pulls_checks_and_leaves_no_credentials(node) -> None:
    state, env, runtime = node
    result, progress = pull(env, plan(runtime))
    assert result.returncode == 0, result.stdout + result.stderr
    assert progress.pulled and not progress.present and progress.failure is None
    assert (progress.layers_total, progress.check_code) == (2, 0)
    argv = (state / "argv").read_text()
    assert "right" not in argv  # the password went through standard input only
    assert "--authfile" in argv  # a per-job auth file...
    assert not (Path(env["HOME"]) / "run" / "registry-auth").exists()  # ...removed after
    assert "--tls-verify=false" not in argv  # not an insecure registry


def test_pull_missing_skips_a_present_image_and_always_pulls_it_again(node) -> None:
    state, env, runtime = node
    (state / "present").touch()
    _, progress = pull(env, plan(runtime, username=None))
    assert progress.present and not progress.pulled
    assert " pull " not in (state / "argv").read_text()
    _, progress = pull(env, plan(runtime, username=None, always=True))
    assert progress.pulled


def test_insecure_registries_alone_are_reached_over_plain_http(node) -> None:
    state, env, runtime = node
    insecure = container.ContainerRuntime(
        kind="podman", command=runtime.command, insecure_registries=("10.213.0.1:5000",)
    )
    pull(env, plan(insecure))
    assert all("--tls-verify=false" in line for line in (state / "argv").read_text().splitlines()
               if line.startswith(("login", "pull")))  # fmt: skip
    (state / "argv").unlink()
    pull(env, plan(insecure, image="10.9.9.9:5000/x:1", registry="10.9.9.9:5000"))
    assert "--tls-verify=false" not in (state / "argv").read_text()


@pytest.mark.parametrize(
    ("setup", "password", "failure", "words"),
    [
        ("", "hunter2-bad", "login-failed", ["wrong credentials", "password_secret"]),
        ("rm exists", "right", "pull-failed", ["does not exist", "check the repository and tag"]),
        ("rm image-bin/torchrun", "right", "checked", ["has no torchrun", "launcher: none"]),
        ("rm image-bin/bash", "right", "checked", ["has no bash"]),
    ],
)
def test_each_failure_names_the_image_and_what_to_do(
    node, tmp_path: Path, setup: str, password: str, failure: str, words: list[str]
) -> None:
    state, env, runtime = node
    if setup:
        subprocess.run(setup, shell=True, cwd=tmp_path if "image-bin" in setup else state,
                       check=True)  # fmt: skip
    result, progress = pull(env, plan(runtime), password)
    assert result.returncode != 0
    assert progress.failure == failure
    message, hint = container.pull_failure(plan(runtime).image, progress, "0 (l-1)")
    assert plan(runtime).image in message
    for word in words:
        assert word in message + hint, (message, hint)
    assert password not in message + hint or password == "right"


def test_launcher_none_needs_no_torchrun_in_the_image(node, tmp_path: Path) -> None:
    _, env, runtime = node
    (tmp_path / "image-bin" / "torchrun").unlink()
    result, progress = pull(env, plan(runtime, needs_torchrun=False))
    assert result.returncode == 0 and progress.check_code == 0


def test_a_gpu_node_without_the_nvidia_runtime_is_told_what_it_needs() -> None:
    progress = container.PullProgress()
    for line in (
        f"{container.PULL_MARK} present",
        'docker: Error response from daemon: could not select device driver "" with '
        "capabilities: [[gpu]].",
        f"{container.PULL_MARK} checked 125",
    ):
        progress.feed(line)
    message, hint = container.pull_failure("nvcr.io/nvidia/pytorch:24.05-py3", progress, "1")
    assert "has GPUs" in message and "nvcr.io/nvidia/pytorch:24.05-py3" in message
    assert "NVIDIA container toolkit" in hint


def test_progress_lines_are_data(node) -> None:
    progress = container.PullProgress()
    for line in (
        f"{container.PULL_MARK} bytes 1024",
        f"{container.PULL_MARK} bytes ９９",  # not ASCII digits: ignored
        f"{container.PULL_MARK} bytes 99999999999999999999999",  # absurd: ignored
        f"{container.PULL_MARK} bytes -5",
        f"{container.PULL_MARK}",
        "abc: Pulling fs layer",
        "abc: Pull complete",
        "def: Already exists",
        *(f"line {i}" for i in range(100)),
    ):
        progress.feed(line)
    assert progress.bytes_received == 1024
    assert (progress.layers_total, progress.layers_done) == (2, 2)
    assert len(progress.output) == 40 and progress.output[-1] == "line 99"
    assert progress.failure is None and not progress.pulled
