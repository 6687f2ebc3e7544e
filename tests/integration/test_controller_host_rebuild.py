"""A controller host that kept its own ledger (SQLite on the host, no team database) is killed
mid-job: its ledger dies with it. The next `orch controller up` brings a new host that rebuilds
the job from the laptop's hand-over kit and the job's running nodes, and adopts it there.

The job had already been recovered once by the old host (both its nodes reclaimed, so none of
the nodes that run now was there at its start), and has a max_runtime. The rebuilt job keeps
what the laptop's kit carries of it: its first start, its recovery and the bill of its first
nodes; so it times out at its original max_runtime, not a fresh one from its new nodes' launch.

While no host runs, node 1 of the job is reclaimed as well, so the rebuilt job lacks a rank:
the new host keeps node 0 and replaces rank 1 alone, and the replacement gets the workdir the
laptop sent again (the old host's copy died with it). No node is left at the end.

The host is a launched local node in loopback mode, so it and its job's nodes are peers on this
machine (one local root, like one cloud account) and the job's nodes outlive the host.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.providers.local.host import pids_with_marker
from tests.support.controller_host import Laptop, loopback_laptop
from tests.support.helpers import processes_with_marker
from tests.support.waiting import wait_until

MAX_RUNTIME = 150  # s: past the recovery, the host's death and the rebuild, with room to spare
PRICE = "3.6"  # USD per node-hour: a tenth of a cent a second, so the bill moves


@pytest.fixture
def laptop(tmp_path: Path) -> Iterator[Laptop]:
    with loopback_laptop(tmp_path, ORCH_LOCAL_PRICE_PER_HOUR=PRICE) as laptop:
        yield laptop


# `make test` keeps the rebuild's logic in tests/unit/control/repair (the ledger written from the
# nodes' kits, their figures and limits) and a killed host's takeover in
# test_controller_host_takeover.py; this whole path (three minutes) runs in `make soak`.
@pytest.mark.soak
def test_a_killed_host_with_its_own_ledger_is_rebuilt_from_the_jobs_nodes_with_its_limits(
    tmp_path: Path, laptop: Laptop
) -> None:
    old_host = laptop.host_up("--provider", "local")["instance_id"]
    job_id = laptop.submit_counter(
        tmp_path,
        "rebuilt",
        nodes=2,
        steps=100_000,
        extra=f"budget: {{max_runtime: {MAX_RUNTIME}}}\n",
    )
    started = laptop.job(job_id)["started_at"]
    first = {i.rank: i.instance_id for i in laptop.provider.list_owned(job_id=job_id)}
    assert sorted(first) == [0, 1], first
    laptop.provider.terminate(list(first.values()))  # reclaimed while the old host drives it

    def recovered() -> dict | None:
        """The job once it runs again on new nodes, which have written a checkpoint since."""
        job = laptop.job(job_id)  # each answer renews the kit's figures
        kinds = [event["kind"] for event in job.get("events") or []]
        restarted = len(kinds) - kinds[::-1].index("RUNNING") if "RUNNING" in kinds else None
        fresh = restarted is not None and "CHECKPOINT" in kinds[restarted:]
        running = job["state"] == "RUNNING" and job["recoveries"] == 1 and fresh
        return job if running and len(job["leases"]) == 4 else None

    before = wait_until(recovered, f"{job_id} to recover onto new nodes", 120, interval=1)
    nodes = {i.rank: i.instance_id for i in laptop.provider.list_owned(job_id=job_id)}
    assert not set(nodes.values()) & set(first.values()), nodes

    laptop.provider.terminate([old_host])  # the host dies, its ledger with it
    assert pids_with_marker(old_host) == set(), "the host lives on"
    laptop.provider.terminate([nodes[1]])  # and node 1 is taken while no controller runs
    assert processes_with_marker(nodes[0]), "node 0 went with the host"

    document = laptop.host_up()
    assert document["replaced"]["terminated"] == old_host, document
    assert document["handed_over"] == [job_id] and document["rebuilt"] == [job_id], document
    assert document["lost"] == {}, document
    assert f"job {job_id}: sending its workdir" in document["stderr"], document
    rebuilt = laptop.job(job_id)
    # Its first start, its recovery and its first nodes' bill came over with the kit.
    assert rebuilt["started_at"] == started, (rebuilt["started_at"], started)
    assert rebuilt["recoveries"] >= 1 and rebuilt["spend_usd"] >= before["spend_usd"], rebuilt
    leases = {lease["instance_id"]: lease for lease in rebuilt["leases"]}
    assert set(first.values()) <= set(leases), leases
    assert all(leases[iid]["ended_at"] for iid in first.values()), leases

    job = laptop.wait_end(job_id, MAX_RUNTIME + 60)
    events = job.get("events") or []
    assert job["state"] == "TIMED_OUT", json.dumps(events)[-3000:]
    ran = datetime.fromisoformat(job["ended_at"]) - datetime.fromisoformat(started)
    assert MAX_RUNTIME <= ran.total_seconds() < MAX_RUNTIME + 30, ran  # the original limit
    kinds = [event["kind"] for event in events]
    assert kinds[:2] == ["REBUILT", "ADOPTED"], kinds
    assert "carried over" in events[0]["message"], events[0]
    preempted = [e["message"] for e in events if e["kind"] == "PREEMPTED"]
    assert len(preempted) == 1 and "node 1 (no node known)" in preempted[0], preempted
    assert job["recoveries"] == 2, job  # the old host's, then rank 1 replaced by the new one
    # Node 0 stayed, with its checkpoint files; only rank 1 was launched again.
    leases = {lease["instance_id"]: lease for lease in job["leases"]}
    assert len(leases) == 5 and nodes[0] in leases and leases[nodes[0]]["rank"] == 0, leases
    assert all(lease["ended_at"] for lease in leases.values())
    resumed = [e for e in events if e["kind"] == "RESUMED"]
    assert len(resumed) == 1 and (resumed[0]["step"] or 0) > 0, json.dumps(events, indent=1)

    code, out, err = laptop.orch("controller", "down", "--json")
    assert code == 0, out + err
    for instance in (old_host, *first.values(), *nodes.values()):
        assert processes_with_marker(instance) == [], f"{instance} still runs"
    assert laptop.provider.list_owned() == [], "a node is left"
