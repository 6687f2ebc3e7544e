"""Guard terms only shrink, and a transfer holds the dead-man off for a bounded time.

A renewed lease replaces the limits a node booted with, but never lifts them past the ceilings
in its terms: a controller that counts the job's start or spend afresh (one that rebuilt the
job from its nodes, or a stale one) cannot give a node more than it was launched with. The
guard runs here as on a node, against real files in a temporary home, and a real rsync.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.node import guard
from orchestrator.node.guard_limits import capped, moved_bytes
from tests.unit.node.test_guard_program import NOW, Node, rsync_writing_as, terms

FAR = time.time() + 10 * 86400


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def test_a_lease_never_lifts_the_runtime_ceiling_the_node_booted_with(tmp_path: Path) -> None:
    now = time.time()
    node = Node(tmp_path, runtime_deadline=at(now + 60), runtime_ceiling=at(now + 60))
    node.training()
    node.heartbeat(age_s=60)  # no controller heard for a minute
    node.lease(runtime_deadline=FAR, lease_until=FAR)  # a fresh count of max_runtime
    assert node.guard.due(now + 59) is None
    kind, since, _ = node.guard.due(now + 61) or ("lifted", 0.0, "")
    assert kind == "max_runtime" and abs(since - (now + 60)) < 1.0
    node.lease(runtime_deadline=None, lease_until=FAR)  # nor can a lease drop the limit
    assert node.guard.due(now + 61)[0] == "max_runtime"
    node.lease(runtime_deadline=now + 30, lease_until=FAR)  # a lease may shrink it
    assert node.guard.due(now + 31)[:2] == ("max_runtime", now + 30)


def test_a_lease_never_lifts_the_budget_ceiling_the_node_booted_with(tmp_path: Path) -> None:
    # $1 left at $36/h (this launch's $1/h and $35/h of the nodes beside it): 100 s, less the
    # 20 s kept for the stop (grace and allowance)
    node = Node(
        tmp_path, budget_left_usd=Decimal(1), others_hourly_usd=Decimal(35), stop_allowance_s=15
    )
    terms_doc = json.loads(node.terms.read_text())
    assert terms_doc["budget_ceiling"] == terms_doc["made_at"] + 80
    node.training()
    node.heartbeat(age_s=60)
    node.lease(runtime_deadline=None, lease_until=FAR)  # a spend that forgot earlier nodes
    ceiling = node.guard.anchor + 80
    assert node.guard.due(ceiling - 1) is None
    assert node.guard.due(ceiling + 1)[:2] == ("budget", ceiling)


def test_the_boot_terms_are_mapped_onto_the_nodes_clock_from_its_first_arming(
    tmp_path: Path,
) -> None:
    """Terms made on a controller whose clock is an hour behind the node's (or an hour before
    the node booted) hold from the node's arming, not an hour early."""
    made = datetime.now(UTC) - timedelta(hours=1)
    home = tmp_path / "node"
    home.mkdir()
    document = terms(
        runtime_deadline=made + timedelta(seconds=100),
        runtime_ceiling=made + timedelta(seconds=100),
    ).for_node(now=made, hourly_usd=Decimal(1), poweroff="true", home=str(home))
    (home / "terms.json").write_text(document)
    watcher = guard.Guard(str(home / "terms.json"))
    armed = watcher.anchor
    assert abs(armed - time.time()) < 5
    assert watcher.due(armed + 99) is None
    assert watcher.due(armed + 101)[:2] == ("max_runtime", armed + 100)
    # A guard started again (a reboot) keeps its first arming: its limits do not move.
    time.sleep(0.05)  # on purpose: the clock moves before the restart
    again = guard.Guard(str(home / "terms.json"))
    assert again.anchor == armed


def test_a_kept_cluster_node_has_no_ceiling_each_job_brings_its_own_limits() -> None:
    kept = terms(
        autostop=True,
        runtime_deadline=NOW + timedelta(seconds=60),
        runtime_ceiling=NOW + timedelta(seconds=60),
        budget_left_usd=Decimal(1),
    )
    doc = json.loads(kept.for_node(now=NOW, hourly_usd=Decimal(1), poweroff="true"))
    assert doc["runtime_ceiling"] is None and doc["budget_ceiling"] is None
    assert doc["runtime_deadline"] is not None and doc["lease_until"] is not None
    job = json.loads(replace(kept, autostop=False).for_node(now=NOW, hourly_usd=Decimal(1),
                                                            poweroff="true"))  # fmt: skip
    assert doc["made_at"] == job["made_at"] == NOW.timestamp()
    assert job["runtime_ceiling"] == job["runtime_deadline"] == NOW.timestamp() + 60


def test_a_monthly_cap_is_no_ceiling_other_jobs_ending_may_lengthen_its_lease() -> None:
    capped_terms = terms(
        budget_left_usd=Decimal(100),
        # $2 left of the team's month, at $18/h of others: the lease ends first by it
        shared_budgets=((Decimal(2), Decimal(18)),),
    )
    doc = json.loads(capped_terms.for_node(now=NOW, hourly_usd=Decimal(18), poweroff="true"))
    assert doc["lease_until"] < doc["budget_ceiling"] == NOW.timestamp() + 20000 - 20


def test_capped_takes_the_earlier_and_keeps_the_ceiling_where_the_limit_is_unset() -> None:
    assert capped(5.0, None) == 5.0
    assert capped(None, None) is None
    assert capped(None, 7.0) == 7.0
    assert capped(9.0, 7.0) == 7.0
    assert capped(3.0, 7.0) == 3.0


def test_a_stale_transfer_stops_holding_off_the_dead_man(tmp_path: Path) -> None:
    """An rsync whose peer is gone (it waits, moving nothing) counts as a live controller for
    the guard's silence only; then the dead-man acts."""
    node = Node(tmp_path / "node", deadman_s=5.0)
    node.heartbeat(age_s=3600)
    sync = rsync_writing_as(node.home)
    try:
        settled(sync.pid)
        now = time.time()
        assert node.guard.due(now) is None  # a sync just seen
        assert node.guard.controller_alive(now + 9)
        kind = (node.guard.due(now + 11) or ("held off",))[0]
        assert kind == "deadman"
        assert not node.guard.controller_alive(now + 11)
    finally:
        os.killpg(sync.pid, signal.SIGKILL)
        sync.wait()


def settled(pid: int) -> None:
    """Once the rsync `pid` has started up and waits on its peer: its counters stay still."""
    deadline = time.monotonic() + 10
    last, still_since = moved_bytes(pid), time.monotonic()
    while time.monotonic() - still_since < 0.5:
        assert time.monotonic() < deadline, "rsync never settled"
        time.sleep(0.05)
        moved = moved_bytes(pid)
        if moved != last:
            last, still_since = moved, time.monotonic()


def test_a_transfer_counts_at_most_the_terms_hold(tmp_path: Path) -> None:
    node = Node(tmp_path / "node", deadman_s=5.0, transfer_hold_s=0.3)
    node.heartbeat(age_s=3600)
    sync = rsync_writing_as(node.home)
    try:
        time.sleep(0.5)  # older than any push of the controller's lasts
        assert not node.guard.controller_alive(time.time())
        assert (node.guard.due(time.time()) or ("held off",))[0] == "deadman"
    finally:
        os.killpg(sync.pid, signal.SIGKILL)
        sync.wait()
