"""A kept cluster's idle nodes on a real local node: `orch reconcile` leaves an up cluster's
nodes running (they wait for the next job, billed to the cluster), and `orch down NAME` ends
them at once, closing the cluster's idle bill where the provider said they ended. On a shared
ledger `down` leaves other machines' clusters, and jobs, alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings, load_settings
from orchestrator.control.process.machine_id import machine_id
from orchestrator.control.repair.reconcile import reconcile
from orchestrator.control.verbs import commands
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import DOWN, UP, Clusters
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import Job, Ledger, make_engine, utcnow
from tests.support.kept_node import launch_kept_node

pytestmark = [pytest.mark.timeout(120)]


def test_reconcile_spares_an_up_kept_cluster_and_down_ends_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch", local=LocalSettings(network="loopback"))  # type: ignore[arg-type]
    ledger = Ledger(make_engine(settings.db_path))
    clusters = Clusters(ledger)
    cluster, provider, node = launch_kept_node(settings, ledger)
    try:
        clusters.release(cluster.id, [(node.instance_id, 0, node.price_per_hour)], utcnow())

        report = reconcile(settings, ledger, [provider])
        assert report.terminated == {} and report.nodes == 1
        assert [i.instance_id for i in provider.list_owned()] == [node.instance_id]
        assert clusters.get(cluster.id).state == UP

        result = commands.down(settings, ledger, "dev")
        assert result.kept_down == ("dev",)
        assert [i for g in result.ended for i in g.instance_ids] == [node.instance_id]
        assert provider.list_owned() == []
        down = clusters.get(cluster.id)
        assert down.state == DOWN and down.reason == "orch down"
        (idle,) = clusters.idle_leases(cluster.id)
        assert idle.ended_at is not None and idle.ended_at <= down.ended_at
    finally:
        provider.terminate([i.instance_id for i in provider.list_owned()])


def test_on_a_shared_ledger_down_leaves_other_machines_clusters_and_jobs_alone(
    tmp_path: Path,
) -> None:
    """No node needed: what `down` records. Machine b's `down dev` and `down --all` keep a's
    cluster `dev` up, and b's own `dev` too while a job that machine a drives runs on it."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = (
        load_settings({"ORCH_HOME": str(tmp_path / name), "ORCH_DATABASE_URL": url,
                       "ORCH_LOCAL_ROOT": str(tmp_path / "cloud")})
        for name in ("a", "b")
    )  # fmt: skip
    ledger = Ledger(make_engine(url))
    clusters = Clusters(ledger)
    shape = {"provider": "local", "nodes": 1, "gpus_per_node": 1, "autostop_s": 600.0}
    dev_a = clusters.create("dev", **shape, now=utcnow(), machine=machine_id(a.home))  # type: ignore[arg-type]
    dev_b = clusters.create("dev", **shape, now=utcnow(), machine=machine_id(b.home))  # type: ignore[arg-type]
    ledger.add_job(
        Job(
            id="adopted-1", name="adopted", provider="local", nodes=1, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=utcnow(), cluster_id=dev_b.id,
            state=JobState.RUNNING, controller=f"{machine_id(a.home)}:1",
        )
    )  # fmt: skip
    clusters.hold(dev_b.id, "adopted-1", utcnow())
    ControllerLeases(ledger).take("adopted-1", f"{machine_id(a.home)}:1", machine_id(a.home),
                                  length_s=60)  # fmt: skip

    result = commands.down(b, ledger, "dev")
    assert result.kept_down == () and result.elsewhere == ("adopted-1",)
    everything = commands.down(b, ledger, None)
    assert everything.kept_down == () and everything.elsewhere == ("adopted-1",)
    assert [(c.name, c.cluster_id, c.machine) for c in everything.left_alone] == [
        ("dev", dev_a.id, machine_id(a.home))
    ]
    assert clusters.get(dev_a.id).state == UP and clusters.get(dev_b.id).state == UP
