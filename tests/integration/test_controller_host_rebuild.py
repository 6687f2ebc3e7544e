"""A controller host that kept its own ledger (SQLite on the host, no team database) is killed
mid-job: its ledger dies with it. The next `orch controller up` brings a new host that rebuilds
the job from the laptop's hand-over kit and the job's running nodes, and adopts it there.

While no host runs, node 1 of the job is reclaimed as well, so the rebuilt job lacks a rank:
the new host keeps node 0 and replaces rank 1 alone, and the replacement gets the workdir the
laptop sent again (the old host's copy died with it). The job succeeds and no node is left.

The host is a launched local node in loopback mode, so it and its job's nodes are peers on this
machine (one local root, like one cloud account) and the job's nodes outlive the host.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.providers.local.host import pids_with_marker
from tests.support.controller_host import Laptop, loopback_laptop
from tests.support.helpers import processes_with_marker

STEPS = 40


@pytest.fixture
def laptop(tmp_path: Path) -> Iterator[Laptop]:
    with loopback_laptop(tmp_path) as laptop:
        yield laptop


def test_a_killed_host_with_its_own_ledger_is_rebuilt_from_the_jobs_nodes(
    tmp_path: Path, laptop: Laptop
) -> None:
    old_host = laptop.host_up("--provider", "local")["instance_id"]
    job_id = laptop.submit_counter(tmp_path, "rebuilt", nodes=2, steps=STEPS)
    nodes = {i.rank: i.instance_id for i in laptop.provider.list_owned(job_id=job_id)}
    assert sorted(nodes) == [0, 1], nodes

    laptop.provider.terminate([old_host])  # the host dies, its ledger with it
    assert pids_with_marker(old_host) == set(), "the host lives on"
    laptop.provider.terminate([nodes[1]])  # and node 1 is taken while no controller runs
    assert processes_with_marker(nodes[0]), "node 0 went with the host"

    document = laptop.host_up()
    assert document["replaced"]["terminated"] == old_host, document
    assert document["handed_over"] == [job_id] and document["rebuilt"] == [job_id], document
    assert document["lost"] == {}, document
    assert f"job {job_id}: sending its workdir" in document["stderr"], document

    job = laptop.wait_end(job_id, 150)
    events = job.get("events") or []
    assert job["state"] == "SUCCEEDED", json.dumps(events)[-3000:]
    assert job["step"] == STEPS and job["recoveries"] == 1, job
    kinds = [event["kind"] for event in events]
    assert kinds[:2] == ["REBUILT", "ADOPTED"], kinds
    preempted = [e["message"] for e in events if e["kind"] == "PREEMPTED"]
    assert len(preempted) == 1 and "node 1 (no node known)" in preempted[0], preempted
    # Node 0 stayed, with its checkpoint files; only rank 1 was launched again.
    leases = {lease["instance_id"]: lease for lease in job["leases"]}
    assert len(leases) == 2 and nodes[0] in leases and nodes[1] not in leases, leases
    assert leases[nodes[0]]["rank"] == 0 and all(lease["ended_at"] for lease in leases.values())
    resumed = [e for e in events if e["kind"] == "RESUMED"]
    assert len(resumed) == 1 and (resumed[0]["step"] or 0) > 0, json.dumps(events, indent=1)

    code, out, err = laptop.orch("controller", "down", "--json")
    assert code == 0, out + err
    for instance in (old_host, *nodes.values()):
        assert processes_with_marker(instance) == [], f"{instance} still runs"
    assert laptop.provider.list_owned() == [], "a node is left"
