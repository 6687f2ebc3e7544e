"""Jobs in a container image on real namespace nodes, from a real private registry.

The image is the test image built offline (Debian's packages, see tests/support/containers.py),
pushed to Debian's docker-registry with htpasswd auth on this machine's address on the nodes'
bridge; the nodes run it with podman. torch comes in through a `volumes` entry, the way the
rest of the suite has it. Shown here:

- a 2-node x 2-process DDP job (the reference trainer, gloo) runs inside the image (it reads
  the image's own marker file), its in-place checkpoint is mirrored, and a reclaim of node 1
  with a notice reaches the trainers as SIGTERM through the runtime: the job resumes in new
  containers from the emergency checkpoint and succeeds;
- a missing image and wrong credentials fail the job within seconds of the pull, with a message
  that names the image and what to do, the bill holding the seconds used, nothing left running;
- a kept cluster's second job skips the pull.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.local import net
from orchestrator.providers.local.provider import LocalProvider
from tests.support.containers import (
    MARKER,
    Registry,
    host_state,
    offline_image,
    push_image,
    running_registry,
    torch_volume,
)
from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    assert_spend_is_leases,
    detach,
    events,
    fast_env,
    job_json,
    preempt,
    run_orch,
    wait_for,
    wait_for_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# A bridge and subnet of these jobs' own: the registry listens on the bridge's address from
# before the first node, and no other test's nodes come and go on it meanwhile (the bridge
# goes when the last node on it ends: tests beside this one end theirs on the default one).
BRIDGE = "orchctr0"
SUBNET = IPv4Network("10.213.77.0/24")  # other tests take 0, 7 and 100-249
FAKE_SIZE = 3072  # 2 nodes x 2 ranks x batch 32: 24 steps per epoch
EPOCHS = 2
TARGET_STEPS = FAKE_SIZE // (2 * 2 * 32) * EPOCHS


@dataclass(frozen=True)
class Private:
    """The private registry and the test image in it."""

    registry: Registry
    ref: str  # the image's reference
    key: str  # what the image's marker file holds
    volume: str  # the `volumes` entry giving containers the suite's torch
    site: str  # its path, for PYTHONPATH


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    """docker-registry on the bridge's address (made first when no node has made it yet: the
    registry listens there before any node exists), the image pushed to it. Afterwards the
    bridge goes when no node uses it, and the machine is as it was."""
    before = host_state()
    made = subprocess.run(["ip", "link", "show", "dev", BRIDGE], capture_output=True)
    if made.returncode != 0:
        for argv in net.bridge_create_argvs(BRIDGE, SUBNET):
            subprocess.run(argv, check=True, capture_output=True)
    image = offline_image()
    volume, site = torch_volume()
    try:
        with running_registry(str(net.bridge_address(SUBNET))) as registry:
            ref = push_image(image, registry, "team/train")
            yield Private(registry, ref, image.key, volume, site)
    finally:
        home = tmp_path_factory.mktemp("cleanup")
        local = LocalSettings(bridge=BRIDGE, subnet=SUBNET)
        LocalProvider(Settings(home=home, local=local)).cleanup_network()
    assert host_state() == before


def container_env(home: Path, private: Private, password: str | None = None) -> dict[str, str]:
    return fast_env(
        home,
        ORCH_LOCAL_PRICE_PER_HOUR="0.90",
        ORCH_LOCAL_INSECURE_REGISTRIES=private.registry.address,
        ORCH_LOCAL_BRIDGE=BRIDGE,
        ORCH_LOCAL_SUBNET=str(SUBNET),
        REGISTRY_TOKEN=private.registry.password if password is None else password,
    )


def container_section(private: Private, image: str | None = None) -> str:
    return (
        "container:\n"
        f"  image: {image or private.ref}\n"
        f"  credentials: {{username: {private.registry.user}, password_secret: REGISTRY_TOKEN}}\n"
        f'  volumes: ["{private.volume}"]\n'
        f'env: {{PYTHONPATH: "{private.site}", OMP_NUM_THREADS: "1"}}\n'
        "secrets: {REGISTRY_TOKEN: null}\n"
    )


def test_ddp_job_runs_in_the_image_and_resumes_in_new_containers_after_a_notice(
    tmp_path: Path, private: Private
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: boxed\nworkdir: {REPO}\n"
        "run: >-\n"
        f"  cat {MARKER} &&\n"
        f"  python3 -m orch_trainer.train --model tiny --data fake --fake-size {FAKE_SIZE}\n"
        f"  --epochs {EPOCHS} --batch-size 32 --workers 0 --checkpoint-every 6 --log-every 2\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 2}\n" + container_section(private)
    )
    env = container_env(tmp_path / "orch", private)
    job_id = detach(spec, env)
    before = wait_for(job_id, env, lambda j: (j["step"] or 0) >= 8, "step 8", timeout=300)
    preempt(job_id, env, node=1, notice=10)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=300)
    assert job["state"] == "SUCCEEDED", job
    assert job["step"] == TARGET_STEPS and job["recoveries"] == 1
    # Node 1 alone was replaced: node 0 ran through (one lease), its boot not paid again.
    assert len(job["leases"]) == 3 and all(lease["market"] == "spot" for lease in job["leases"])
    assert sorted(lease["rank"] for lease in job["leases"]) == [0, 1, 1]
    assert_spend_is_leases(job)
    (preempted,) = events(job, "PREEMPTED")
    assert preempted["message"].startswith("notice: node 1")
    # The replacement was launched at the notice, before the emergency checkpoint was pulled.
    kinds = [event["kind"] for event in job["events"]]
    replacement = kinds.index("LAUNCHED", kinds.index("PREEMPTED"))
    assert replacement < kinds.index("SALVAGED") < kinds.index("RECOVERING"), kinds
    # The image came to both nodes, then to node 1's replacement; node 0 kept its copy.
    pulls = [e["message"] for e in events(job, "IMAGE")]
    assert pulls[0].startswith(f"pulled {private.ref} on 2 node(s)"), pulls
    assert any("on 1 node(s)" in p and "already on 1 node(s)" in p for p in pulls[1:]), pulls
    # The trainers heard the notice through the runtime: the emergency checkpoint was written
    # at or after the step of the notice, and the run resumed from it.
    (resumed,) = events(job, "RESUMED")
    assert resumed["step"] is not None and resumed["step"] >= before["step"], job["events"]
    logs = tmp_path / "orch" / "jobs" / job_id / "logs"
    log = (logs / "node-0.log").read_text()
    assert private.key in log, log[-2000:]  # the image's own file, not the host's
    assert '"event": "resume"' in log or '"event":"resume"' in log, log[-2000:]
    mirrored = list((tmp_path / "orch" / "jobs" / job_id / "checkpoints").rglob("*"))
    assert [p for p in mirrored if p.is_file()], "no checkpoint was mirrored"
    assert_nothing_left(job)


def test_a_missing_image_and_wrong_credentials_fail_fast_and_say_what_to_do(
    tmp_path: Path, private: Private
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "noop.py").write_text("print('never runs')\n")
    missing = private.ref.rsplit(":", 1)[0] + ":not-pushed"
    jobs = {}
    for name, image, password in (
        ("missing", missing, None),
        ("refused", private.ref, "wrong-password"),
    ):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(
            f"name: {name}\nworkdir: work\nrun: python3 noop.py\n"
            "resources: {nodes: 1, gpus_per_node: 1}\n" + container_section(private, image)
        )
        env = container_env(tmp_path / name, private, password)
        jobs[name] = (detach(spec, env), env)
    for name, (job_id, env) in jobs.items():
        job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=180)
        assert job["state"] == "FAILED", job
        reason = job["reason"]
        image = missing if name == "missing" else private.ref
        assert image in reason, reason
        if name == "missing":
            assert "does not exist" in reason and "check the repository and tag" in reason
        else:
            assert "wrong credentials" in reason and "password_secret" in reason, reason
            assert "wrong-password" not in reason
        # failed within seconds of the pull: the start was never reached
        kinds = [e["kind"] for e in job["events"]]
        assert "RUNNING" not in kinds, kinds
        started = datetime.fromisoformat(job["leases"][0]["launched_at"])
        ended = datetime.fromisoformat(job["leases"][0]["ended_at"])
        assert (ended - started).total_seconds() < 90, job["leases"]
        assert float(job["spend_usd"]) > 0  # the seconds the node ran are billed
        assert_nothing_left(job)


def test_a_kept_clusters_second_job_skips_the_pull(tmp_path: Path, private: Private) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text(f"print(open('{MARKER}').read().strip())\n")
    env = container_env(tmp_path / "orch", private)
    ids = []
    for n in (1, 2):
        spec = tmp_path / f"job{n}.yaml"
        spec.write_text(
            f"name: kept-{n}\nworkdir: work\nrun: python3 hello.py\nlauncher: none\n"
            "resources: {nodes: 1, gpus_per_node: 1}\n" + container_section(private)
        )
        ids.append(detach(spec, env, "--cluster", "boxes"))
        job = wait_for_state(ids[-1], env, {"SUCCEEDED", "FAILED"}, timeout=180)
        assert job["state"] == "SUCCEEDED", job
    first, second = (job_json(i, env) for i in ids)
    try:
        (pulled,) = events(first, "IMAGE")
        assert pulled["message"].startswith(f"pulled {private.ref} on 1 node(s) in "), pulled
        assert [e["message"] for e in events(second, "IMAGE")] == [
            f"{private.ref} already on 1 node(s): no pull"
        ]
        assert {x["instance_id"] for x in first["leases"]} == {
            x["instance_id"] for x in second["leases"]
        }
    finally:
        down = run_orch(["down", "boxes"], env, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
