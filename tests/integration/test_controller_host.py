"""A controller host adopted with `--host` on a real local node drives a job the laptop
submitted with `--remote`: `orch controller up` installs this orch there from a wheel and starts
its supervised daemon; the job succeeds while no orch process runs on the laptop side; the
laptop's `orch status JOB --json` asks the host; the job's secret is in no process's arguments,
nor in the host's daemon log or ledger; `orch controller down` leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.host import handover
from tests.support.controller_host import (
    AdoptableNode,
    adoptable_node,
    cmdlines_with,
    node_cmdlines,
)
from tests.support.helpers import (
    HOLD_FILE,
    counter_run,
    counter_workdir,
    processes_with_marker,
    run_orch,
)
from tests.support.waiting import wait_until

SECRET = "s3cr3t-only-over-stdin-7f1c"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[AdoptableNode]:
    """One local node to adopt, reachable with the key `tmp_path/key`; ended afterwards."""
    with adoptable_node(tmp_path) as adoptable:
        yield adoptable


def test_a_job_submitted_remote_runs_on_the_adopted_host_and_down_leaves_nothing(
    tmp_path: Path, node: AdoptableNode
) -> None:
    instance, env, provider, home = node.instance, node.env, node.provider, node.home
    up = run_orch(node.up_args("0"), env, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    status = json.loads(run_orch(["controller", "status", "--json"], env).stdout)
    assert status["reachable"] and status["running"], status
    assert status["version"] and status["uptime_s"] is not None and status["jobs"] == []

    spec = tmp_path / "job.yaml"
    counter_workdir(tmp_path)
    spec.write_text(
        "name: remote-counter\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        # The run waits after step 1 until the ssh and tunnel checks below have reached the
        # node through the host, which takes a minute and more on a loaded machine.
        f"run: {counter_run(12, step_s=0.5, hold_at=1)}\nsecrets: {{HOST_TOKEN: null}}\n"
    )
    submitted = run_orch(["submit", str(spec), "--remote"], {**env, "HOST_TOKEN": SECRET})
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    # What a new host would need to take the job over stays here, private (0600).
    assert handover.complete(home, job_id), list(handover.kit_dir(home, job_id).rglob("*"))
    for path in handover.kit_dir(home, job_id).rglob("*"):
        assert path.is_dir() or path.stat().st_mode & 0o077 == 0, path
    key = handover.kit_dir(home, job_id) / "keys" / job_id / "id_ed25519"
    key.unlink()  # as if the job had made no key yet when it was submitted
    assert run_orch(["status", job_id, "--json"], env, timeout=60).returncode == 0
    assert handover.complete(home, job_id), "orch status did not fetch the kit again"

    # Nothing of orch runs for this ORCH_HOME on the laptop side: whatever did is killed now.
    laptop = [p for p in processes_with_marker(f"ORCH_HOME={home}")
              if p not in processes_with_marker(instance.instance_id)]  # fmt: skip
    for pid in laptop:
        os.kill(pid, signal.SIGKILL)

    seen: list[str] = []
    said: list[subprocess.CompletedProcess[str]] = []
    tunnelled: list[bytes] = []

    def finished() -> dict | None:
        seen.extend(cmdlines_with(SECRET))
        result = run_orch(["status", job_id, "--json"], env, timeout=60)
        assert result.returncode == 0, result.stderr
        job = json.loads(result.stdout)
        if job["state"] == "RUNNING" and (job["step"] or 0) >= 1 and not said:
            # a command line for the node's shell, through the host, as ssh hands it over;
            # its exit status comes back
            command = ["ssh", job_id, "--node", "0", "--", "echo on-node; exit 3"]
            said.append(run_orch(command, env, timeout=120))
            tunnelled.append(through_a_tunnel(job_id, env))
            go = f"touch ~/orch-jobs/{job_id}/workdir/{HOLD_FILE}"  # the run goes on
            released = run_orch(["ssh", job_id, "--node", "0", "--", go], env, timeout=120)
            assert released.returncode == 0, released.stdout + released.stderr
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    job = wait_until(finished, f"{job_id} ends on the host", timeout=400, interval=1)
    assert job["state"] == "SUCCEEDED", json.dumps(job.get("events"))[-3000:]
    assert job["id"] == job_id and job["step"] == 12
    assert seen == [], "the secret appeared in a process's arguments"
    human = run_orch(["status", job_id], env)
    assert human.returncode == 0 and job_id in human.stdout, human.stderr
    # The other commands of a job run on the host too, and answer here as for a local job.
    waited = run_orch(["wait", job_id], env, timeout=60)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    followed = run_orch(["logs", job_id, "--follow"], env, timeout=60)  # ended: -f returns
    assert followed.returncode == 0 and '"step": 12' in followed.stdout, followed.stderr
    # without -f too: passed through as it comes, never cut at a captured command's cap
    whole = run_orch(["logs", job_id], env, timeout=60)
    assert whole.returncode == 0 and '"step": 12' in whole.stdout, whole.stderr
    assert said and (said[0].returncode, said[0].stdout.strip()) == (3, "on-node"), said
    assert tunnelled == [b"through-the-host"], tunnelled
    # Lists here show the job that lives on the host, and the bill counts it.
    listed = json.loads(run_orch(["status", "--json"], env, timeout=60).stdout)["jobs"]
    (row,) = [r for r in listed if r["id"] == job_id]
    assert row["state"] == "SUCCEEDED" and row["controller_host"].endswith(node.instance.ssh_host)
    bill = json.loads(run_orch(["cost", "--json"], env, timeout=60).stdout)
    (line,) = [r for r in bill["jobs"] if r["id"] == job_id]
    assert line["leases"] == 1 and line["node_hours"] > 0  # the node the host launched for it
    assert bill["total_usd"] >= line["spend_usd"]
    one = json.loads(run_orch(["cost", "--job", job_id, "--json"], env, timeout=60).stdout)
    assert [r["id"] for r in one["jobs"]] == [job_id]
    ended = run_orch(["cancel", job_id], env, timeout=60)  # the host's answer, said here
    assert (ended.returncode, ended.stdout.strip()) == (0, f"job {job_id} already ended: "
                                                           "SUCCEEDED"), ended.stderr  # fmt: skip
    picture = tmp_path / "remote-report.png"
    drawn = run_orch(["report", job_id, "--out", str(picture), "--json"], env, timeout=120)
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert json.loads(drawn.stdout)["path"] == str(picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    root = node.root
    assert (root / "home").is_dir(), "the host's ORCH_HOME is on the host"
    for path in [root / "daemon.log", *(root / "home").glob("*.db*")]:
        assert SECRET.encode() not in path.read_bytes(), f"the secret is in {path}"
    assert not list(root.glob("submissions/*/secrets.env")), "the secrets file was left"

    logs = run_orch(["controller", "logs", "--tail", "5"], env)
    assert logs.returncode == 0 and "controller-host daemon" in logs.stdout, logs.stderr

    down = run_orch(["controller", "down", "--json"], env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert json.loads(down.stdout)["stopped"] is True
    # The node's own processes: other tests may run hosts of their own meanwhile.
    assert node_cmdlines(instance.instance_id, "orchestrator.host.daemon") == []
    assert node_cmdlines(instance.instance_id, "supervise.sh") == []
    gone = run_orch(["controller", "status", "--json"], env)
    assert gone.returncode != 0 and "no controller host" in gone.stderr

    provider.terminate([instance.instance_id])  # the adopted machine itself is the test's
    assert processes_with_marker(instance.instance_id) == []


# Answers every connection until none came for 60 s: on a loaded machine a first connection
# through both hops can outlast the caller's wait, and its answer must not be the only one.
ANSWERS = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); s.settimeout(60)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(b'through-the-host'); c.close()\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def through_a_tunnel(job_id: str, env: dict[str, str]) -> bytes:
    """What a server bound to the node's loopback answers at this machine's end of
    `orch ssh JOB -L LOCAL:localhost:REMOTE` (two hops: here -> the host -> the node)."""
    local, remote = free_port(), free_port()
    argv = ["ssh", job_id, "-L", f"{local}:localhost:{remote}", "--",
            shlex.join(["python3", "-c", ANSWERS, str(remote)])]  # fmt: skip
    session = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *argv], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:

        def answer() -> bytes:
            try:
                with socket.create_connection(("127.0.0.1", local), timeout=20) as conn:
                    return conn.recv(64)
            except OSError:
                return b""

        with contextlib.suppress(AssertionError):  # the caller says what it got instead
            return wait_until(answer, "an answer through the tunnel", 150, interval=0.3)
        return b""
    finally:
        # the whole session: orch's ssh to the host, which outlives orch killed alone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session.pid, signal.SIGKILL)
        session.communicate()
