"""The pull script on a node that has received more than 2 GiB: its network counters pass
2**31, which awk may print as `3e+09`. The script, run by a real bash and the machine's awk
against a stand-in runtime, still counts the bytes of the pull and waits for its end before it
checks the image."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.node import container

# `image inspect`: is it here; `pull`: takes a moment, the counters grow, then it is here;
# `run` (the image check): fails as a real runtime does when the pull has not ended
RUNTIME = r"""#!/usr/bin/env bash
state=$FAKE_RUNTIME_STATE
case "$1" in
image) [ -f "$state/present" ] ;;
pull)
    sleep 1.5
    printf '%s\n' "$AFTER" > "$FAKE_COUNTERS"
    touch "$state/present"; echo "Writing manifest to image destination" ;;
run)
    [ -f "$state/present" ] || { echo "Trying to pull ${@: -3:1}..."; exit 125; } ;;
esac
"""


def counters(received: int) -> str:
    """/proc/net/dev's text with `received` bytes on eth0 (and some on lo, not counted)."""
    return (
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes\n"
        "    lo: 5000000000 10 0 0 0 0 0 0 5000000000 10 0 0 0 0 0 0\n"
        f"  eth0: {received} 20 0 0 0 0 0 0 700 5 0 0 0 0 0 0\n"
    )


@pytest.mark.parametrize("before", [3_000_000_000, 2_100_000_000, 5_000_000])
def test_counters_past_two_gib_are_counted_and_the_pull_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: int
) -> None:
    pulled = 400_000_123
    net = tmp_path / "net-dev"
    net.write_text(counters(before))
    monkeypatch.setattr(container, "NET_COUNTERS", str(net))
    state = tmp_path / "state"
    state.mkdir()
    program = tmp_path / "runtime.sh"
    program.write_text(RUNTIME)
    program.chmod(0o755)
    env = {
        "HOME": str(tmp_path), "PATH": os.environ["PATH"], "FAKE_RUNTIME_STATE": str(state),
        "FAKE_COUNTERS": str(net), "AFTER": counters(before + pulled),
    }  # fmt: skip
    plan = container.PullPlan(
        image="10.213.0.1:5000/team/big:1",
        registry="10.213.0.1:5000",
        runtime=container.ContainerRuntime(kind="podman", command=str(program)),
        auth_dir='"$HOME"/run/registry-auth',
        needs_torchrun=False,
    )
    result = subprocess.run(
        ["bash", "-c", container.pull_script(plan)], env=env, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    progress = container.PullProgress()
    for line in result.stdout.splitlines():
        progress.feed(line)
    assert result.returncode == 0, result.stdout + result.stderr
    assert progress.pulled and progress.check_code == 0, result.stdout
    assert progress.bytes_received == pulled, result.stdout
    assert result.stderr == ""
