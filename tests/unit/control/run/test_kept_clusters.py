"""Kept clusters (`orch submit --cluster NAME`) without nodes: the bill that moves between a
job and its cluster, the setup digest and the node's skip of an unchanged setup, joining a
cluster, the flags, and the guard's autostop."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cli.kept import kept_request as _kept_request
from orchestrator.control.run.kept_turn import (
    GUARD_EARLY_S,
    ClusterBusy,
    KeptRequest,
    check_cluster_name,
    join_cluster,
    setup_digest,
    why_down,
)
from orchestrator.errors import SpecError
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import DOWN, Clusters, autostop_left
from orchestrator.ledger.store import Job, Lease, Ledger, lease_cost, make_engine
from orchestrator.node import guard
from orchestrator.node.clear_protocol import reset_command
from orchestrator.node.guard_protocol import GuardLease, cleared_lease
from orchestrator.node.launch import NodeLayout, setup_lines
from orchestrator.report.clusters import cluster_document
from orchestrator.report.documents import cost_document
from tests.unit.node.test_guard_program import Node

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
PRICE = Decimal("1.80")  # per node-hour: half a cent a second


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ledger_with_cluster(tmp_path: Path) -> tuple[Ledger, Clusters, str]:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    clusters = Clusters(ledger)
    cluster = clusters.create(
        "dev", provider="local", nodes=2, gpus_per_node=1, autostop_s=600.0, now=T0
    )
    return ledger, clusters, cluster.id


def add_job(ledger: Ledger, job_id: str, cluster_id: str | None, state: str) -> Job:
    return ledger.add_job(
        Job(
            id=job_id, name="j", provider="local", nodes=2, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=T0, cluster_id=cluster_id, state=state,
        )
    )  # fmt: skip


def job_lease(job_id: str, cluster_id: str, instance: str, rank: int, start: datetime) -> Lease:
    return Lease(
        job_id=job_id, cluster=cluster_id, provider="local", instance_id=instance, rank=rank,
        market="on-demand", instance_type="local-1x", price_per_hour=PRICE, launched_at=start,
    )  # fmt: skip


# --- the bill ---------------------------------------------------------------------------------


def test_every_second_of_a_kept_node_is_billed_once_to_a_job_or_to_the_cluster(
    tmp_path: Path,
) -> None:
    ledger, clusters, cid = ledger_with_cluster(tmp_path)
    nodes = [("i-a", 0, PRICE), ("i-b", 1, PRICE)]
    # job 1 runs 0-100 s, the cluster idles 100-160 s, job 2 runs 160-200 s, down at 230 s.
    add_job(ledger, "job-1", cid, JobState.SUCCEEDED)
    clusters.hold(cid, "job-1", at(0))
    for instance, rank, _ in nodes:
        ledger.open_lease(job_lease("job-1", cid, instance, rank, at(0)))
    ledger.close_leases(["i-a", "i-b"], at(100))
    clusters.release(cid, nodes, at(100))
    assert clusters.get(cid).idle_since == at(100)
    assert clusters.get(cid).job_id is None

    add_job(ledger, "job-2", cid, JobState.SUCCEEDED)
    clusters.hold(cid, "job-2", at(160))
    for instance, rank, _ in nodes:
        ledger.open_lease(job_lease("job-2", cid, instance, rank, at(160)))
    assert [lease.ended_at for lease in clusters.idle_leases(cid)] == [at(160), at(160)]
    ledger.close_leases(["i-a", "i-b"], at(200))
    clusters.release(cid, nodes, at(200))
    # Ending the nodes closes the cluster's idle leases as it closes a job's.
    assert ledger.close_leases(["i-a", "i-b"], at(230)) == 2
    clusters.down(cid, at(230), "orch down")

    now = at(10_000)  # long after: nothing is still billing
    per_second = PRICE / 3600
    assert ledger.spend("job-1", now) == 2 * 100 * per_second
    assert ledger.spend("job-2", now) == 2 * 40 * per_second
    assert clusters.idle_cost(cid, now) == 2 * (60 + 30) * per_second
    doc = cluster_document(ledger, clusters.get(cid), now)
    assert doc["state"] == DOWN and doc["reason"] == "orch down"
    assert doc["jobs"] == ["job-1", "job-2"]
    assert doc["idle_node_hours"] == pytest.approx(2 * 90 / 3600)
    # The whole bill is each node's 230 s of life, once.
    assert cost_document(ledger)["total_usd"] == pytest.approx(float(2 * 230 * per_second))


def test_an_up_cluster_shows_its_price_idle_time_queue_and_autostop(tmp_path: Path) -> None:
    ledger, clusters, cid = ledger_with_cluster(tmp_path)
    nodes = [("i-a", 0, PRICE), ("i-b", 1, PRICE)]
    clusters.release(cid, nodes, at(0))
    add_job(ledger, "waiting-1", cid, JobState.PENDING)
    add_job(ledger, "elsewhere", None, JobState.PENDING)
    doc = cluster_document(ledger, clusters.get(cid), at(90))
    assert doc["hourly_usd"] == float(2 * PRICE)
    assert doc["idle_s"] == 90
    assert doc["autostop_left_s"] == 510
    assert doc["queue"] == ["waiting-1"]
    assert doc["job"] is None
    assert doc["idle_usd"] == pytest.approx(float(2 * 90 * PRICE / 3600))


def test_autostop_counts_only_while_the_cluster_is_idle() -> None:
    from orchestrator.ledger.store import KeptCluster

    idle = KeptCluster(
        id="dev-1", name="dev", provider="local", nodes=1, gpus_per_node=1, autostop_s=60.0,
        created_at=T0, idle_since=at(10),
    )  # fmt: skip
    assert autostop_left(idle, at(40)) == 30
    assert autostop_left(idle, at(100)) == -30  # past due: its guards act
    held = idle.model_copy(update={"idle_since": None, "job_id": "job-1"})
    assert autostop_left(held, at(1000)) is None
    never = idle.model_copy(update={"autostop_s": None})
    assert autostop_left(never, at(1000)) is None


def test_an_idle_cluster_that_ended_about_when_due_is_said_autostopped() -> None:
    """EC2 keeps no word of why a node shut itself down, only when (to the second). A guard
    counts the idle time from its own record, so it may end the nodes a little before the
    ledger's reckoning: that is still its autostop, not nodes gone for an unknown reason."""
    from orchestrator.ledger.store import KeptCluster

    idle = KeptCluster(
        id="dev-1", name="dev", provider="aws", nodes=1, gpus_per_node=1, autostop_s=600.0,
        created_at=T0, idle_since=at(0),
    )  # fmt: skip
    assert why_down(idle, set(), at(600)).startswith("autostop")
    assert why_down(idle, set(), at(600 - GUARD_EARLY_S)).startswith("autostop")
    assert why_down(idle, set(), at(300)) == "its nodes are gone"  # long before: a reclaim
    assert why_down(idle, {"budget"}, at(700)) == "its nodes are gone"  # a guard said why
    assert why_down(idle, {"autostop"}, at(10)).startswith("autostop: its guards")


def test_a_lease_closes_at_its_start_when_the_cluster_ends_before_it() -> None:
    from orchestrator.ledger.store import IdleLease

    lease = IdleLease(
        cluster_id="c", instance_id="i", rank=0, price_per_hour=PRICE, launched_at=at(50),
        ended_at=at(50),
    )  # fmt: skip
    assert lease_cost(lease, at(100)) == 0


# --- joining a cluster --------------------------------------------------------------------------


def test_a_submit_joins_the_up_cluster_of_its_name_or_records_a_new_one(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    request = KeptRequest("dev", autostop_s=600.0)
    first = join_cluster(ledger, request, provider="local", nodes=2, gpus_per_node=1)
    again = join_cluster(
        ledger, KeptRequest("dev", autostop_s=None), provider="local", nodes=2, gpus_per_node=1
    )
    assert again.id == first.id
    assert again.autostop_s is None  # the latest submit's autostop holds
    Clusters(ledger).down(first.id, at(1), "orch down")
    fresh = join_cluster(ledger, request, provider="local", nodes=2, gpus_per_node=1)
    assert fresh.id != first.id and fresh.name == "dev"


def test_a_job_of_another_shape_is_refused_with_what_to_do(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    join_cluster(ledger, KeptRequest("dev"), provider="local", nodes=2, gpus_per_node=1)
    with pytest.raises(SpecError) as info:
        join_cluster(ledger, KeptRequest("dev"), provider="local", nodes=4, gpus_per_node=1)
    assert info.value.exit_code == 2
    assert "2 node(s) x 1 GPU(s) on local" in str(info.value)
    assert "--nodes 2 --gpus 1" in (info.value.hint or "")


def test_no_wait_fails_at_once_while_a_live_job_holds_the_cluster(tmp_path: Path) -> None:
    ledger, clusters, cid = ledger_with_cluster(tmp_path)
    add_job(ledger, "job-1", cid, JobState.RUNNING)
    clusters.hold(cid, "job-1", at(0))
    busy = KeptRequest("dev", wait=False)
    with pytest.raises(ClusterBusy) as info:
        join_cluster(ledger, busy, provider="local", nodes=2, gpus_per_node=1)
    assert info.value.exit_code == 3
    assert "job-1" in str(info.value)
    assert join_cluster(ledger, KeptRequest("dev"), provider="local", nodes=2, gpus_per_node=1)
    ledger.update_job("job-1", state=JobState.SUCCEEDED)  # a final holder holds nothing
    assert join_cluster(ledger, busy, provider="local", nodes=2, gpus_per_node=1).id == cid


@pytest.mark.parametrize(
    ("flags", "wanted"),
    [
        ((None, "10m", False, False), "--autostop is for kept clusters"),
        (("dev", "never", False, False), "--autostop never keeps the cluster billing"),
        (("dev", "soon", False, False), "--autostop:"),
        (("Dev_1", None, False, False), "is not a cluster name"),
    ],
)
def test_kept_cluster_flags_are_checked_before_anything_runs(
    flags: tuple[str | None, str | None, bool, bool], wanted: str
) -> None:
    with pytest.raises(SpecError) as info:
        _kept_request(*flags)
    assert wanted in str(info.value)
    assert info.value.exit_code == 2


def test_kept_cluster_flags_give_the_request() -> None:
    assert _kept_request(None, None, False, False) is None
    assert _kept_request("dev", None, False, False) == KeptRequest("dev", 600.0, wait=True)
    assert _kept_request("dev", "90s", True, False) == KeptRequest("dev", 90.0, wait=False)
    assert _kept_request("dev", "never", False, True) == KeptRequest("dev", None, wait=True)
    assert check_cluster_name("a" * 40) == "a" * 40
    with pytest.raises(SpecError):
        check_cluster_name("a" * 41)


# --- setup only when it changed ---------------------------------------------------------------


def test_the_setup_digest_follows_its_text_and_the_workdir_files_it_names(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "requirements.txt").write_text("numpy\n")
    (tmp_path / "outside.txt").write_text("x")
    setup = "pip install -r requirements.txt"
    first = setup_digest(setup, work)
    assert first is not None and setup_digest(setup, work) == first
    (work / "train.py").write_text("print('changed code')\n")  # not named by setup
    assert setup_digest(setup, work) == first
    (work / "requirements.txt").write_text("numpy\ntorch\n")
    assert setup_digest(setup, work) != first
    assert setup_digest(setup + " --quiet", work) != setup_digest(setup, work)
    outside = setup_digest("cat ../outside.txt", work)
    (tmp_path / "outside.txt").write_text("y")  # outside the workdir: not synced, not read
    assert setup_digest("cat ../outside.txt", work) == outside
    assert setup_digest(None, work) is None


def run_setup(home: Path, setup: str, key: str | None) -> subprocess.CompletedProcess[str]:
    layout = NodeLayout("dev-1")
    script = "\n".join(
        ["finish() { echo finished $1; exit $1; }", *setup_lines(setup, key, layout), "echo ran"]
    )
    return subprocess.run(
        ["bash", "-c", script], env={**os.environ, "HOME": str(home)}, cwd=home,
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_node_skips_a_setup_it_already_ran_with_the_same_digest(tmp_path: Path) -> None:
    (tmp_path / "orch-jobs" / "dev-1").mkdir(parents=True)
    setup = "echo once >> count.txt"
    assert "setup: running" in run_setup(tmp_path, setup, "k1").stdout
    second = run_setup(tmp_path, setup, "k1")
    assert "unchanged since it last ran on this node, skipped" in second.stdout
    assert second.stdout.rstrip().endswith("ran")
    run_setup(tmp_path, setup, "k2")  # setup or what it names changed
    assert (tmp_path / "count.txt").read_text() == "once\nonce\n"
    run_setup(tmp_path, setup, None)  # no digest (not a kept cluster): always runs
    assert (tmp_path / "count.txt").read_text().count("once") == 3


def test_a_failed_setup_is_not_remembered_as_done(tmp_path: Path) -> None:
    (tmp_path / "orch-jobs" / "dev-1").mkdir(parents=True)
    failed = run_setup(tmp_path, "echo try >> tries.txt; exit 3", "k1")
    assert "setup failed with exit code 3" in failed.stdout
    assert failed.returncode != 0
    run_setup(tmp_path, "echo try >> tries.txt; exit 3", "k1")
    assert (tmp_path / "tries.txt").read_text() == "try\ntry\n"


# --- the guard's autostop ---------------------------------------------------------------------


def test_autostop_ends_a_kept_node_with_no_job_no_controller_and_idle_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings: list[float] = [0.0]
    monkeypatch.setattr(guard, "gpu_utilizations", lambda timeout_s, indices=None: list(readings))
    node = Node(tmp_path, deadman_s=60.0, autostop=True)
    node.heartbeat(age_s=30)
    now = time.time()
    assert node.guard.due(now) is None  # 30 s of 60
    node.training()
    node.heartbeat(age_s=3600)
    assert node.guard.due(now) is None  # a job's run: never ended for idleness of the cluster
    (node.run_dir / "exit_code").write_text("0\n")
    kind, _, message = node.guard.due(now)
    assert kind == "autostop" and "idle GPUs" in message
    readings[:] = [80.0]  # the user's own process on a GPU, started over `orch ssh`
    assert node.guard.due(now) is None
    readings[:] = [0.0]
    assert node.guard.due(now + 30) is None  # busy a moment ago
    assert node.guard.due(now + 61)[0] == "autostop"


def test_the_reset_for_the_next_job_counts_as_the_controller_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that takes the cluster just before its autostop is due: the reset must not leave
    the guard with nothing newer than the last job's release to go by."""
    monkeypatch.setattr(guard, "gpu_utilizations", lambda timeout_s, indices=None: [0.0])
    node = Node(tmp_path, deadman_s=60.0, autostop=True)
    node.lease(**cleared_lease(T0, 60.0).fields("j-1", 0.0))  # the last job let go a minute ago
    node.heartbeat(age_s=59)  # the new controller's first probe, a minute ago too
    now = time.time()
    assert node.guard.due(now) is None  # 59 s of 60
    subprocess.run(
        ["bash", "-c", reset_command(NodeLayout("j-1"), None)],
        env={**os.environ, "HOME": str(tmp_path)}, cwd=tmp_path, check=True,
    )  # fmt: skip
    assert node.guard.due(now + 2) is None  # heard at the reset: no autostop
    assert node.guard.due(now + 62)[0] == "autostop"  # ... but only that long


def test_the_controllers_cleared_lease_sets_the_autostop_and_drops_the_jobs_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard, "gpu_utilizations", lambda timeout_s, indices=None: [0.0])
    node = Node(tmp_path, deadman_s=60.0, autostop=True, idle_timeout_s=5.0)
    node.heartbeat(age_s=3600)
    doc = cleared_lease(T0, None).fields("j-1", 0.0)
    assert doc["lease_until"] is None and doc["runtime_deadline"] is None
    assert doc["idle_timeout_s"] is None
    node.lease(**doc)
    assert node.guard.due(time.time() + 86_400) is None  # autostop never
    node.lease(**cleared_lease(T0, 30.0).fields("j-1", 0.0))  # written a minute ago
    assert node.guard.due(time.time())[0] == "autostop"


def test_a_jobs_lease_on_a_kept_node_carries_its_own_idle_timeout_and_the_autostop() -> None:
    doc = GuardLease(
        renewed_at=T0,
        runtime_deadline=None,
        lease_until=None,
        idle_timeout_s=300.0,
        job_limits=True,
        autostop_s=600.0,
    ).fields("j-1", 0.0)
    assert doc["idle_timeout_s"] == 300.0 and doc["autostop_s"] == 600.0
    plain = GuardLease(renewed_at=T0, runtime_deadline=None, lease_until=None).fields("j-1", 0.0)
    assert "idle_timeout_s" not in plain and "autostop_s" not in plain
