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

from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.local.host import pids_with_marker
from tests.support.controller_host import Laptop, loopback_laptop
from tests.support.helpers import processes_with_marker


@dataclass
class TeamLaptop:
    laptop: Laptop
    ledger: Ledger  # the team database both hosts use


@pytest.fixture
def team(tmp_path: Path) -> Iterator[TeamLaptop]:
    url = f"sqlite:///{tmp_path / 'team.db'}"
    with loopback_laptop(
        tmp_path, ORCH_DATABASE_URL=url, ORCH_CONTROLLER_LEASE="3", ORCH_LEASE_RENEWAL="1"
    ) as laptop:
        engine = make_engine(url)
        try:
            yield TeamLaptop(laptop, Ledger(engine))
        finally:
            engine.dispose()


def test_a_killed_host_is_replaced_and_the_new_host_adopts_its_job(
    tmp_path: Path, team: TeamLaptop
) -> None:
    laptop = team.laptop
    old_host = laptop.host_up("--provider", "local")["instance_id"]
    job_id = laptop.submit_counter(tmp_path, "outlives-its-host", nodes=1, steps=50)
    nodes = [lease.instance_id for lease in team.ledger.leases(job_id)]
    assert len(nodes) == 1, nodes

    killed = laptop.provider.terminate([old_host])  # the host dies, its ORCH_HOME with it
    assert pids_with_marker(old_host) == set(), "the host lives on"
    assert processes_with_marker(nodes[0]), "the job's node went with the host"

    document = laptop.host_up()
    assert "is dead: its node" in document["stderr"], document
    new_host = document["instance_id"]
    assert new_host != old_host and document["replaced"]["terminated"] == old_host, document
    assert document["handed_over"] == [job_id] and document["lost"] == {}, document
    assert document["rebuilt"] == [], document  # the team database kept its rows

    job = laptop.wait_end(job_id, 90)
    assert job["state"] == "SUCCEEDED", json.dumps(job.get("events"))[-3000:]
    assert job["step"] == 50 and job["recoveries"] == 0, job
    assert [lease.instance_id for lease in team.ledger.leases(job_id)] == nodes  # one cluster
    assert team.ledger.leases(job_id, open_only=True) == []
    kinds = [event.kind for event in team.ledger.events(job_id)]
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
