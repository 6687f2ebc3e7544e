"""`orch ssh` and `orch ssh-config` on a running job's real namespace nodes: a command's exit
status and arguments come through whole, `--node` picks the node, `-L` reaches a server on
node 0, the printed `Host` blocks work with the system's own ssh, mistakes exit 2, and nothing
is written into ~/.ssh."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support.helpers import (
    ORCH,
    REPO,
    assert_nothing_left,
    detach,
    fast_env,
    job_json,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

MARKER = "served from node 0 through the tunnel"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_ssh_runs_commands_forwards_a_port_and_prints_a_working_ssh_config(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "marker.txt").write_text(MARKER)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: shell\nworkdir: work\nresources: {nodes: 2, gpus_per_node: 1}\n"
        "run: echo $ORCH_NODE_RANK > rank.txt; exec sleep 600\n"
    )
    home = tmp_path / "user-home"  # the user's HOME: ~/.ssh must stay untouched
    home.mkdir()
    env = {**fast_env(tmp_path / "orch"), "HOME": str(home)}
    job_id = detach(spec, env)
    wait_for_state(job_id, env, {"RUNNING"})
    workdir = f"orch-jobs/{job_id}/workdir"

    def ssh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_orch(["ssh", job_id, *args], env, timeout=timeout)

    on_node_1 = wait_until(
        lambda: (
            (r := ssh("--node", "1", "--", "cat", f"{workdir}/rank.txt")).returncode == 0
            and r.stdout
        ),
        "rank 1's file on node 1",
        timeout=60,
    )
    assert on_node_1.strip() == "1"
    assert ssh("--", "cat", f"{workdir}/rank.txt").stdout.strip() == "0"

    # Exit statuses come through; the words after -- are a command line for the node's shell,
    # as with ssh: joined by spaces, so quoting for that shell is the caller's.
    assert ssh("--", "false").returncode == 1
    assert ssh("--", "exit 7").returncode == 7
    quoted = ssh("--", "python3", "-c", "'import sys; print(sys.argv[1:])'", "'a b'", "it\\'s")
    assert quoted.stdout.strip() == "['a b', \"it's\"]", quoted.stderr

    # -L: a server on node 0's loopback, reached from this machine.
    # as with ssh: one command in the background, its output redirected (a backgrounded list
    # would hold the session open)
    started = ssh("--", f"cd {workdir} || exit 1; setsid nohup python3 -m http.server 8000 "
                  "--bind 127.0.0.1 > /dev/null 2>&1 < /dev/null &")  # fmt: skip
    assert started.returncode == 0, started.stderr
    port = free_port()
    tunnel = subprocess.Popen(
        [*ORCH, "ssh", job_id, "-L", f"{port}:localhost:8000", "--", "sleep", "120"],
        env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip

    def fetched() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/marker.txt", timeout=5) as r:
                return r.read().decode()
        except OSError:
            assert tunnel.poll() is None, tunnel.stderr.read() if tunnel.stderr else ""
            return None

    try:
        assert wait_until(fetched, "the page through the tunnel", timeout=60) == MARKER
    finally:
        os.killpg(tunnel.pid, signal.SIGTERM)
        tunnel.wait(timeout=30)

    # ssh-config: the system's ssh reaches each node by its alias.
    config = run_orch(["ssh-config", job_id], env)
    assert config.returncode == 0, config.stderr
    (tmp_path / "ssh_config").write_text(config.stdout)
    for rank in (0, 1):
        own = subprocess.run(
            ["ssh", "-F", str(tmp_path / "ssh_config"), "-o", "BatchMode=yes",
             f"orch-{job_id}-{rank}", "cat", f"{workdir}/rank.txt"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        assert own.returncode == 0 and own.stdout.strip() == str(rank), own.stderr

    # Mistakes exit 2 and say what to do.
    unknown = run_orch(["ssh", "no-such-job", "--", "true"], env)
    assert unknown.returncode == 2 and "no running cluster or job 'no-such-job'" in unknown.stderr
    no_node = ssh("--node", "5", "--", "true")
    assert no_node.returncode == 2 and "has no node 5" in no_node.stderr
    bad = ssh("-L", "6006", "--", "true")
    assert bad.returncode == 2 and "not a port forwarding" in bad.stderr

    cancelled = run_orch(["cancel", job_id], env, timeout=180)
    assert cancelled.returncode == 0, cancelled.stderr
    gone = ssh("--", "true")
    assert gone.returncode == 2 and "has no running nodes (CANCELLED)" in gone.stderr
    assert not (home / ".ssh").exists(), "orch ssh wrote into ~/.ssh"
    assert_nothing_left(job_json(job_id, env))
