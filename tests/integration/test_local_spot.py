"""Spot rehearsal on real local nodes: metadata endpoint, notice watcher, reclaim, capacity."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.notice_watch import NoticeWatcher
from orchestrator.errors import CapacityError, ProviderError
from orchestrator.node.guard_protocol import GuardTerms
from orchestrator.node.spot_notice import SpotNotice
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.host import pids_with_marker
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.local.spot import NOTICE_FILE, post_notice
from orchestrator.remote.keys import Identity, ensure_identity
from tests.integration.test_local_provider import MODES, make_settings, providers
from tests.support.waiting import wait_until

__all__ = ["providers"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.timeout(120)]


def spot_request(
    identity: Identity,
    count: int,
    spot: bool | str,
    job: str = "job-1",
    guard: GuardTerms | None = None,
) -> LaunchRequest:
    return LaunchRequest(
        job_id=job, cluster=job, count=count, gpus_per_node=1,
        public_key=identity.public_key, spot=spot, guard=guard,  # type: ignore[arg-type]
    )  # fmt: skip


def watching_guard(notice_interval_s: float) -> GuardTerms:
    """Terms of a guard with no limit that watches for spot notices every
    `notice_interval_s` (the node's daemon does; the controller follows what it writes)."""
    return GuardTerms(
        job_id="job-1", interval_s=1.0, silence_s=60.0, allowance_s=600.0, deadman_s=None,
        stop_grace_s=1.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        notice_interval_s=notice_interval_s,
    )  # fmt: skip


def loopback_provider(
    tmp_path: Path, providers: list[LocalProvider]
) -> tuple[LocalProvider, Identity]:
    """A local provider on loopback nodes (on-demand $0.90/h), ended by the `providers`
    fixture, and a key to launch with."""
    provider = LocalProvider(make_settings(tmp_path / "orch", "loopback", price="0.90"))
    providers.append(provider)
    return provider, ensure_identity(tmp_path / "keys", "test")


@pytest.mark.parametrize("mode", MODES)
def test_a_notice_reaches_the_watcher_then_the_reclaim_takes_the_node(
    tmp_path: Path, mode: str, providers: list[LocalProvider]
) -> None:
    provider = LocalProvider(make_settings(tmp_path / "orch", mode, price="0.90"))
    providers.append(provider)
    identity = ensure_identity(tmp_path / "keys", "test")
    nodes = provider.launch(spot_request(identity, 2, True, guard=watching_guard(0.5)))
    assert all(n.market == "spot" and n.price_per_hour == Decimal("0.300000") for n in nodes)
    cluster = Cluster(nodes, identity)
    heard: list[tuple[int, SpotNotice, float]] = []
    got = threading.Event()

    def on_notice(rank: int, notice: SpotNotice) -> None:
        heard.append((rank, notice, time.monotonic()))
        got.set()

    watcher = NoticeWatcher(cluster, on_notice)
    watcher.start()
    try:
        wait_until(
            lambda: watcher.status == ["watching", "watching"], "both nodes watched", 30,
            interval=0.1,
        )  # fmt: skip
        reclaim_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
        posted = time.monotonic()
        post_notice(provider.store, nodes[1].instance_id, reclaim_at)
        assert got.wait(10), watcher.status
        rank, notice, when = heard[0]
        assert rank == 1 and notice.action == "terminate" and notice.time == reclaim_at
        assert when - posted < 2.0  # one poll interval and a little
        time.sleep(1.5)  # on purpose: three more polls, which must not tell it again
        assert len(heard) == 1  # once per node and notice
    finally:
        watcher.stop()
        cluster.close()
    taken = provider.reclaim(nodes[1].instance_id)
    assert taken is not None and taken.tzinfo is not None
    assert pids_with_marker(nodes[1].instance_id) == set()
    assert provider.preempted([n.instance_id for n in nodes]) == {nodes[1].instance_id}
    assert [n.instance_id for n in provider.list_owned()] == [nodes[0].instance_id]
    with pytest.raises(ProviderError, match="not running"):
        provider.reclaim(nodes[1].instance_id)
    provider.terminate([n.instance_id for n in nodes])
    assert provider.preempted([n.instance_id for n in nodes]) == set()


def test_spot_capacity_refused_and_auto_falls_back_to_on_demand(
    tmp_path: Path, providers: list[LocalProvider]
) -> None:
    provider, identity = loopback_provider(tmp_path, providers)
    provider.set_spot_available(False)
    with pytest.raises(CapacityError, match="no spot capacity"):
        provider.launch(spot_request(identity, 1, True))
    assert provider.list_owned() == []
    (node,) = provider.launch(spot_request(identity, 1, "auto"))
    assert node.market == "on-demand" and node.price_per_hour == Decimal("0.90")
    provider.set_spot_available(True)
    (spot,) = provider.launch(spot_request(identity, 1, "auto"))
    assert spot.market == "spot" and spot.price_per_hour == Decimal("0.300000")


def test_a_reclaim_under_notice_ends_as_soon_as_the_owner_lets_the_node_go(
    tmp_path: Path, providers: list[LocalProvider]
) -> None:
    provider, identity = loopback_provider(tmp_path, providers)
    (node,) = provider.launch(spot_request(identity, 1, True))
    outcome: list[datetime | None] = []
    reclaiming = threading.Thread(
        target=lambda: outcome.append(provider.reclaim(node.instance_id, notice_s=60))
    )
    reclaiming.start()
    notice = provider.store.node_dir(node.instance_id) / NOTICE_FILE
    wait_until(notice.exists, "the notice", 10, interval=0.05)
    # the notice is up; the owner (a job that saved its work) lets the node go
    let_go = time.monotonic()
    provider.terminate([node.instance_id])
    reclaiming.join(timeout=30)
    assert not reclaiming.is_alive(), "the reclaim sat out the whole notice"
    assert outcome == [None]  # nothing was taken: the owner ended the node first
    assert time.monotonic() - let_go < 5
