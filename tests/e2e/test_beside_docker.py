"""Local namespace nodes on a machine where Docker's daemon runs.

Starting dockerd sets iptables' FORWARD policy to DROP and loads br_netfilter, which sends the
traffic bridged between local nodes through FORWARD: without a rule of orch's, node 1 could not
reach the master's port on node 0, while SSH from the controller (not forwarded) still worked,
and the job sat in its rendezvous. Here a real dockerd runs on the "host" (a network namespace of
the test's own, where the controller runs too: see `tests.support.dockerd`), and one real job
(torchrun, gloo, 2 nodes) trains, loses node 1 without notice, gets a new node 1 whose torchrun
reaches the master on node 0, and succeeds. orch's rule goes with the last node, and the machine
is as the test found it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.dockerd import host_state, running_dockerd
from tests.support.helpers import ORCH, REPO, assert_nothing_left, fast_env, job_json
from tests.support.netns_host import nsenter_argv, private_host, sh
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.e2e

STEPS = 30
ACCUM = 4  # each step's all-reduces are what the nodes exchange over the bridge
BRIDGE = "orchdk0"


def job_spec(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: beside-docker\n"
        f"workdir: {REPO}\n"
        "run: >-\n"
        "  python -m orch_trainer.train --model tiny --data fake --fake-size 100000\n"
        f"  --steps {STEPS} --batch-size 32 --accum {ACCUM} --workers 0 --checkpoint-every 4\n"
        "  --log-every 1\n"
        "resources: {nodes: 2, gpus_per_node: 1}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 1}\n"
        "env: {OMP_NUM_THREADS: '1'}\n"
    )
    return path


def orch_in(host: str, args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    """Run orch on the "host" (the namespace where dockerd runs); returns its stdout."""
    out = subprocess.run(
        [*nsenter_argv(host), *ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_job_beside_dockerd_trains_loses_node_1_and_recovers(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    home.mkdir()
    (home / "config.yaml").write_text(f"local: {{network: namespace, bridge: {BRIDGE}}}\n")
    env = fast_env(home)
    found = host_state()
    with private_host("orchdk-") as host, running_dockerd(host) as docker:
        assert "-P FORWARD DROP" in docker.iptables and "-N DOCKER-USER" in docker.iptables
        assert sh(host, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables").stdout == "1\n"

        job_id = orch_in(host, ["submit", str(job_spec(tmp_path)), "--detach"], env).split()[-1]
        ledger = Ledger(make_engine(home / "orch.db"))
        # Without orch's rule the rendezvous never completes: no step is ever reported.
        wait_for_job(ledger, job_id, lambda j: (j.step or 0) >= 3, "step 3", timeout=120)
        rules = sh(host, "iptables-nft", "-S", "DOCKER-USER").stdout.splitlines()
        tagged = f'--comment "orch-bridge:{BRIDGE}"'
        assert f"-A DOCKER-USER -i {BRIDGE} -o {BRIDGE} -m comment {tagged} -j ACCEPT" in rules

        preempt = ["local", "preempt", job_id, "--node", "1", "--notice", "0", "--any-market"]
        lost = json.loads(orch_in(host, [*preempt, "--json"], env))
        assert lost["reclaimed_at"]
        job = wait_for_job(ledger, job_id, lambda j: j.state in ("SUCCEEDED", "FAILED"),
                           "the end", timeout=240)  # fmt: skip
        document = job_json(job_id, env)
        assert job.state == "SUCCEEDED", (job.reason, document["events"])
        assert job.recoveries == 1 and job.step == STEPS
        # node 0 stayed; the new node 1's torchrun reached the master on node 0
        assert sorted(lease["rank"] for lease in document["leases"]) == [0, 1, 1]
        assert_nothing_left(document)
        # orch's rule and bridge went with the last node; Docker's firewall is as it made it
        assert sh(host, "iptables-nft", "-S").stdout == docker.iptables
        assert sh(host, "ip", "link", "show", "dev", BRIDGE, check=False).returncode != 0
    assert host_state() == found
