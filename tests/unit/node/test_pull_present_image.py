"""The pull script on a node that has the image (a kept cluster's next job, `pull: missing`),
run by a real bash against a stand-in runtime: it asks the registry nothing, and a check the
node passed for the same image id is not run again (a container's start costs about a second
on a loaded node); a new image under the same tag, or a check that failed, is checked again."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.node import container
from tests.unit.node.test_container_pull import pull

# `image inspect` prints the id of the image the node has; `pull` makes `next-id` the image;
# `run` (the check) is counted, and fails with torchrun's exit code while `broken` exists
RUNTIME = r"""#!/usr/bin/env bash
state=$FAKE_RUNTIME_STATE
echo "$*" >> "$state/argv"
case "$1" in
login) read -r given; [ "$given" = right ] ;;
image) [ -f "$state/present" ] && cat "$state/present" ;;
pull) cp "$state/next-id" "$state/present" ;;
run) echo run >> "$state/runs"; [ -f "$state/broken" ] && exit 4; exit 0 ;;
esac
"""


def setup(tmp_path: Path) -> tuple[Path, dict[str, str], container.PullPlan]:
    state = tmp_path / "state"
    state.mkdir()
    (state / "next-id").write_text("sha256:aaaa\n")
    program = tmp_path / "runtime.sh"
    program.write_text(RUNTIME)
    program.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "FAKE_RUNTIME_STATE": str(state)}
    plan = container.PullPlan(
        image="10.213.0.1:5000/team/train:1",
        registry="10.213.0.1:5000",
        runtime=container.ContainerRuntime(kind="podman", command=str(program)),
        auth_dir='"$HOME"/run/registry-auth',
        username="bot",
    )
    return state, env, plan


def runs(state: Path) -> int:
    path = state / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_present_image_asks_the_registry_nothing_and_a_passed_check_is_not_run_again(
    tmp_path: Path,
) -> None:
    state, env, plan = setup(tmp_path)
    result, progress = pull(env, plan)  # the cluster's first job: login, pull, check
    assert result.returncode == 0 and progress.pulled, result.stdout + result.stderr
    assert runs(state) == 1
    (state / "argv").unlink()
    # the next job: the image is there; the password is not even read (a wrong one is not used)
    result, progress = pull(env, plan, password="stale")
    assert result.returncode == 0 and progress.present, result.stdout + result.stderr
    assert progress.check_code == 0 and runs(state) == 1  # the check it passed is not run
    argv = (state / "argv").read_text()
    assert "login" not in argv and " pull " not in f" {argv}", argv
    # a launcher: none job's check (no torchrun) is another check: run once, then remembered
    bare = container.PullPlan(**{**plan.__dict__, "needs_torchrun": False})
    assert pull(env, bare)[0].returncode == 0 and runs(state) == 2
    assert pull(env, bare)[0].returncode == 0 and runs(state) == 2


def test_a_new_image_under_the_tag_and_a_failed_check_are_checked_again(tmp_path: Path) -> None:
    state, env, plan = setup(tmp_path)
    (state / "broken").touch()
    result, progress = pull(env, plan)
    assert result.returncode != 0 and progress.check_code == 4
    result, progress = pull(env, plan)  # present now; the failed check was not remembered
    assert progress.present and progress.check_code == 4 and runs(state) == 2
    (state / "broken").unlink()
    assert pull(env, plan)[0].returncode == 0 and runs(state) == 3
    assert pull(env, plan)[0].returncode == 0 and runs(state) == 3  # remembered now
    # `pull: always` brings a new image under the same tag: a new id, checked again
    (state / "next-id").write_text("sha256:bbbb\n")
    always = container.PullPlan(**{**plan.__dict__, "always": True})
    result, progress = pull(env, always)
    assert result.returncode == 0 and progress.pulled and runs(state) == 4
