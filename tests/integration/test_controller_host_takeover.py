"""A controller host killed mid-job is replaced by the next `orch controller up`, and the new
host adopts the job on its existing nodes: the job succeeds, its ledger holds the leases of one
cluster only (no second launch), and nothing runs afterwards.

The host is a launched local node in loopback mode, so it and its job's nodes are peers on this
machine (one local root, like one cloud account) and the job's nodes outlive the host. The
ledger is a team database (`ledger.url`, a SQLite file outside every ORCH_HOME) with short
controller leases, so the new host sees the job's rows and takes its lease once the dead host's
lease has expired.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.local.host import pids_with_marker
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    fast_env,
    processes_with_marker,
    run_orch,
)
from tests.support.waiting import wait_until


@dataclass
class Laptop:
    env: dict[str, str]
    ledger: Ledger
    provider: LocalProvider

    def orch(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        done = run_orch(list(args), self.env, timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    def job(self, job_id: str) -> dict:
        code, out, err = self.orch("status", job_id, "--json", timeout=60)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def laptop(tmp_path: Path) -> Iterator[Laptop]:
    env = fast_env(
        tmp_path / "orch",
        ORCH_HOST_TICK="1",
        ORCH_LOCAL_NETWORK="loopback",
        ORCH_DATABASE_URL=f"sqlite:///{tmp_path / 'team.db'}",
        ORCH_CONTROLLER_LEASE="3",
        ORCH_LEASE_RENEWAL="1",
    )
    engine = make_engine(env["ORCH_DATABASE_URL"])
    provider = LocalProvider(load_settings(env))
    try:
        yield Laptop(env, Ledger(engine), provider)
    finally:
        run_orch(["controller", "down", "--force"], env, timeout=120)
        left = provider.list_owned()
        provider.terminate([i.instance_id for i in left])  # whatever the test left running
        engine.dispose()


def test_a_killed_host_is_replaced_and_the_new_host_adopts_its_job(
    tmp_path: Path, laptop: Laptop
) -> None:
    code, out, err = laptop.orch("controller", "up", "--provider", "local", "--autostop", "0",
                                 "--json")  # fmt: skip
    assert code == 0, out + err
    old_host = json.loads(out)["instance_id"]

    counter_workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: outlives-its-host\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"run: {counter_run(50, step_s=0.5)}\n"
    )
    code, out, err = laptop.orch("submit", str(spec), "--remote")
    assert code == 0, out + err
    job_id = out.strip().splitlines()[-1]
    wait_until(
        lambda: (laptop.job(job_id)["step"] or 0) >= 2, f"{job_id} to train", 60, interval=0.5
    )
    nodes = [lease.instance_id for lease in laptop.ledger.leases(job_id)]
    assert len(nodes) == 1, nodes

    killed = laptop.provider.terminate([old_host])  # the host dies, its ORCH_HOME with it
    assert pids_with_marker(old_host) == set(), "the host lives on"
    assert processes_with_marker(nodes[0]), "the job's node went with the host"

    code, out, err = laptop.orch("controller", "up", "--autostop", "0", "--json")
    assert code == 0, out + err
    assert "is dead: its node" in err, err
    document = json.loads(out)
    new_host = document["instance_id"]
    assert new_host != old_host and document["replaced"]["terminated"] == old_host, document
    assert document["handed_over"] == [job_id] and document["lost"] == {}, document

    def ended() -> dict | None:
        job = laptop.job(job_id)
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    job = wait_until(ended, f"{job_id} to end on the new host", 90, interval=1)
    assert job["state"] == "SUCCEEDED", json.dumps(job.get("events"))[-3000:]
    assert job["step"] == 50 and job["recoveries"] == 0, job
    assert [lease.instance_id for lease in laptop.ledger.leases(job_id)] == nodes  # one cluster
    assert laptop.ledger.leases(job_id, open_only=True) == []
    kinds = [event.kind for event in laptop.ledger.events(job_id)]
    assert "LEASE_TAKEN_OVER" in kinds, kinds

    code, out, err = laptop.orch("controller", "down", "--json")
    assert code == 0, out + err
    assert json.loads(out)["terminated"] == new_host
    # Each host bills as its own line: the dead one up to when its node ended, not to `up`.
    code, out, err = laptop.orch("cost", "--json", timeout=60)
    assert code == 0, err
    hosts = {line["instance_id"]: line for line in json.loads(out)["hosts"]}
    assert set(hosts) == {old_host, new_host} and not any(h["running"] for h in hosts.values())
    ended = datetime.fromisoformat(hosts[old_host]["ended_at"])
    assert abs(ended - killed) < timedelta(seconds=0.25), (ended, killed)  # mtime's grain
    for instance in (old_host, new_host, *nodes):
        assert processes_with_marker(instance) == [], f"{instance} still runs"
    assert laptop.provider.list_owned() == [], "a node is left"
