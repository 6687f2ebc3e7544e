"""A controller host with no job to drive stops itself after `--autostop`: an adopted one ends
its daemon and supervisor (and `orch controller status` says it is not running, with no
autostop time left), a launched local one also powers its node off, and `status` then shows
when its billing stopped, with the spend of its lifetime only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from tests.support.controller_host import AdoptableNode, adoptable_node, node_cmdlines
from tests.support.helpers import fast_env, processes_with_marker, run_orch
from tests.support.waiting import wait_until

AUTOSTOP_S = 3


@pytest.fixture
def node(tmp_path: Path) -> Iterator[AdoptableNode]:
    with adoptable_node(tmp_path, tick_s="1") as adoptable:
        yield adoptable


def test_an_idle_adopted_host_stops_its_daemon_and_supervisor(node: AdoptableNode) -> None:
    iid = node.instance.instance_id
    up = run_orch(node.up_args(f"{AUTOSTOP_S}s"), node.env, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    started = json.loads(up.stdout)
    assert started["running"] and started["autostop_s"] == AUTOSTOP_S, started
    assert node_cmdlines(iid, "supervise.sh"), "no supervisor runs on the host"
    assert node_cmdlines(iid, "orchestrator.host.daemon"), "no daemon runs on the host"

    def stopped() -> bool:
        return not node_cmdlines(iid, "orchestrator.host.daemon") and not node_cmdlines(
            iid, "supervise.sh"
        )

    wait_until(stopped, "the idle host's daemon and supervisor to end", timeout=AUTOSTOP_S + 15)
    status = run_orch(["controller", "status", "--json"], node.env)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["reachable"] and not document["running"], document
    assert document["pid"] is None and document["uptime_s"] is None, document
    assert document["autostop_remaining_s"] == 0, document
    assert "stopping" in (node.root / "daemon.log").read_text()
    assert (node.root / "stop").exists(), "the supervisor would start the daemon again"

    down = run_orch(["controller", "down", "--json"], node.env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr


def test_an_idle_launched_local_host_powers_its_node_off(tmp_path: Path) -> None:
    env = fast_env(tmp_path / "orch", ORCH_HOST_TICK="1")
    home = Path(env["ORCH_HOME"])
    up = run_orch(
        ["controller", "up", "--provider", "local", "--autostop", f"{AUTOSTOP_S}s", "--json"],
        env,
        timeout=120,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    iid = json.loads(up.stdout)["instance_id"]
    try:
        powered_off = home / f"local/powered-off/{iid}.json"
        wait_until(
            lambda: powered_off.exists() and not processes_with_marker(iid),
            f"the idle host {iid} to power itself off",
            timeout=AUTOSTOP_S + 20,
        )
        assert not (home / "local/nodes" / iid).exists(), "the node's disk and record remain"
        off_at = datetime.fromisoformat(json.loads(powered_off.read_text())["at"])

        status = run_orch(["controller", "status", "--json"], env, timeout=60)
        assert status.returncode == 0, status.stderr
        document = json.loads(status.stdout)
        assert not document["running"], document
        assert datetime.fromisoformat(document["billing_stopped_at"]) == off_at, document
        lifetime = (off_at - datetime.fromisoformat(document["launched_at"])).total_seconds()
        spend = Decimal(document["price_per_hour"]) * Decimal(lifetime) / 3600
        assert Decimal(document["spend_usd"]) == spend.quantize(Decimal("0.000001")), document

        down = run_orch(["controller", "down", "--json"], env, timeout=60)
        assert down.returncode == 0, down.stdout + down.stderr
        assert datetime.fromisoformat(json.loads(down.stdout)["billing_stopped_at"]) == off_at
    finally:
        run_orch(["controller", "down", "--force"], env, timeout=60)
    assert processes_with_marker(iid) == []
