"""The closed laptop: a spot job submitted through a controller host is recovered by the host
while no orch process of the user's side runs. A node is reclaimed with a notice; the host
takes the emergency checkpoint, replaces the node and the job succeeds. Afterwards the user's
`orch status JOB --json` shows one recovery, a bill that is the job's node-seconds at the
prices recorded at launch (the reclaimed node's and its replacement's included) and the host's
own line beside it; once the host is down, `orch cost` bills the host for its lifetime.

The host is a launched local node in loopback mode, so the job's nodes are its peers in this
machine's local root, where the test plays the cloud: `orch local preempt` runs with the host's
ORCH_HOME (its ledger knows the job) on that local root.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from orchestrator.config import load_settings
from orchestrator.providers.local.host import pids_with_marker
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    fast_env,
    job_view,
    preempt,
    processes_with_marker,
    run_orch,
)
from tests.support.waiting import wait_until

STEPS = 24


def laptop_pids(home: Path) -> list[int]:
    """Processes whose ORCH_HOME is the laptop's (not the host's, which lives under it)."""
    wanted = f"ORCH_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if wanted in environ:
                found.append(int(entry.name))
    return found


def test_the_host_recovers_a_spot_job_while_the_laptop_is_closed(tmp_path: Path) -> None:
    env = fast_env(tmp_path / "orch", ORCH_HOST_TICK="1", ORCH_LOCAL_NETWORK="loopback",
                   ORCH_LOCAL_PRICE_PER_HOUR="0.90")  # fmt: skip
    home = Path(env["ORCH_HOME"])
    provider = LocalProvider(load_settings(env))
    try:
        up = run_orch(["controller", "up", "--provider", "local", "--autostop", "0", "--json"],
                      env, timeout=120)  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        host = json.loads(up.stdout)["instance_id"]
        host_home = provider.store.node_dir(host) / "disk/.orch-host/home"
        host_env = {**env, "ORCH_HOME": str(host_home),
                    "ORCH_LOCAL_ROOT": str(provider.settings.local_root)}  # fmt: skip

        counter_workdir(tmp_path)
        spec = tmp_path / "job.yaml"
        spec.write_text(
            "name: closed-laptop\nworkdir: work\n"
            "resources: {nodes: 2, gpus_per_node: 1, spot: true}\n"
            f"run: {counter_run(STEPS, step_s=0.4, checkpoint_every=4)}\n"
            "checkpoint: {dir: ~/ckpt, pull_every: 1}\n"
        )
        submitted = run_orch(["submit", str(spec), "--remote"], env, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = submitted.stdout.strip().splitlines()[-1]

        # The laptop closes: every orch process of its ORCH_HOME ends, and none starts again
        # until the job has ended (the job is read from the host's ledger in this process).
        for pid in laptop_pids(home):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: (job_view(job_id, host_env)["step"] or 0) >= 6, "step 6", 60,
                   interval=0.5)  # fmt: skip
        assert laptop_pids(home) == []
        preempt(job_id, host_env, node=1, notice=5)
        wait_until(
            lambda: job_view(job_id, host_env)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
            f"{job_id} to end on the host",
            120,
            interval=0.5,
        )
        assert laptop_pids(home) == [], "an orch process ran on the closed laptop"

        shown = run_orch(["status", job_id, "--json"], env, timeout=60)  # the laptop is back
        assert shown.returncode == 0, shown.stderr
        job = json.loads(shown.stdout)
        assert job["state"] == "SUCCEEDED", json.dumps(job.get("events"))[-3000:]
        shown_events = json.dumps(job.get("events"))[-4000:]
        assert (job["step"], job["recoveries"]) == (STEPS, 1), shown_events
        leases = job["leases"]
        assert sorted(lease["rank"] for lease in leases) == [0, 1, 1], leases
        assert all(lease["market"] == "spot" for lease in leases), leases
        bill = sum(
            Decimal(str(lease["price_per_hour"]))
            * Decimal(
                str(
                    (
                        datetime.fromisoformat(lease["ended_at"])
                        - datetime.fromisoformat(lease["launched_at"])
                    ).total_seconds()
                )
            )
            / 3600
            for lease in leases
        )
        assert Decimal("0") < bill and abs(Decimal(str(job["spend_usd"])) - bill) < Decimal(
            "0.000001"
        ), (job["spend_usd"], bill)

        # The host's own line of the bill, beside the job's: billed from its launch, running.
        line = job["controller_host"]
        assert line["instance_id"] == host and line["running"], line
        assert Decimal(line["price_per_hour"]) == Decimal("0.90") and line["spend_usd"] > 0
        assert job["spend_with_host_usd"] == float(
            Decimal(str(job["spend_usd"])) + Decimal(str(line["spend_usd"]))
        )

        down = run_orch(["controller", "down", "--json"], env, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        stopped = datetime.fromisoformat(json.loads(down.stdout)["billing_stopped_at"])
        cost = run_orch(["cost", "--json"], env, timeout=60)
        assert cost.returncode == 0, cost.stderr
        (billed,) = json.loads(cost.stdout)["hosts"]
        assert billed["instance_id"] == host and not billed["running"], billed
        assert datetime.fromisoformat(billed["ended_at"]) == stopped
        lifetime = stopped - datetime.fromisoformat(billed["launched_at"])
        spend = Decimal("0.90") * Decimal(str(lifetime.total_seconds())) / 3600
        assert abs(Decimal(str(billed["spend_usd"])) - spend) < Decimal("0.000001"), billed
        for instance in [host, *(lease["instance_id"] for lease in leases)]:
            assert pids_with_marker(instance) == set(), f"{instance} still runs"
            assert processes_with_marker(instance) == [], f"{instance} still runs"
    finally:
        run_orch(["controller", "down", "--force"], env, timeout=120)
        provider.terminate([i.instance_id for i in provider.list_owned()])
