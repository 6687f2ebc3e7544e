"""Replacing only the nodes a run lost: which nodes stay, the launch of their replacements,
the survivors' restart on the node (a real shell in a temporary home) and the workdir sync
that keeps a checkpoint directory inside the workdir."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.replacing import (
    joined,
    lost_ranks,
    market_matches,
    replacement_request,
    survivors,
)
from orchestrator.node.launch import NodeLayout, rerun_command, start_command
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.sync import push_argv

NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


def node(rank: int, *, market: str = "spot", zone: str | None = "us-east-1b") -> Instance:
    return Instance(
        instance_id=f"i-{rank}", job_id="j", cluster="j", rank=rank, private_ip=f"10.0.0.{rank}",
        ssh_host="127.0.0.1", ssh_port=22, ssh_user="orch", host_key="ssh-ed25519 K",
        interface="eth0", market=market, instance_type="g5.12xlarge",  # type: ignore[arg-type]
        price_per_hour=Decimal("1.70"), launched_at=NOW, zone=zone,
    )  # fmt: skip


class Provider:
    def __init__(self, taken: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.taken = set(taken)

    def preempted(self, instance_ids: list[str]) -> set[str]:
        return self.taken & set(instance_ids)


class Watch:
    def __init__(self, misses: list[int]) -> None:
        self.misses = misses


def attempt_of(count: int, misses: list[int] | None = None) -> Attempt:
    attempt = Attempt([node(rank) for rank in range(count)], cast(Cluster, object()))
    attempt.watch = cast(Any, Watch(misses or [0] * count))
    return attempt


def lost(*ranks: int) -> Interruption:
    ids = tuple(f"i-{rank}" for rank in ranks)
    return Interruption(ranks, ids, "preempted", "taken back", NOW)


def test_the_nodes_that_stay_are_those_not_lost_not_silent_and_not_taken() -> None:
    attempt = attempt_of(4, misses=[0, 0, 1, 0])  # node 2 missed the last check
    attempt.gone_ranks.add(3)
    stay = survivors(attempt, lost(1), cast(Any, Provider()))
    assert [i.rank for i in stay] == [0]
    stay = survivors(attempt_of(4), lost(1), cast(Any, Provider(taken={"i-3"})))
    assert [i.rank for i in stay] == [0, 2]  # the provider took node 3 meanwhile
    assert survivors(attempt_of(2), lost(0, 1), cast(Any, Provider())) == []
    assert survivors(Attempt([node(0), node(1)]), lost(1), cast(Any, Provider())) == []


def test_the_replacements_take_the_lost_ranks_in_the_survivors_zone_type_and_market() -> None:
    whole = LaunchRequest(
        job_id="j", cluster="j", count=4, gpus_per_node=4, public_key="k", spot="auto",
        instance_types=("g5.12xlarge", "p3.8xlarge"), zones=(), avoid_zones=("us-east-1a",),
    )  # fmt: skip
    staying = [node(1, market="on-demand"), node(3, market="on-demand")]
    request = replacement_request(whole, staying)
    assert (request.count, request.ranks, request.node_ranks) == (2, (0, 2), (0, 2))
    assert request.spot is False and request.instance_types == ("g5.12xlarge",)
    assert request.zones == ("us-east-1b",) and request.avoid_zones == ()
    no_zone = replacement_request(whole, [node(0, zone=None)])
    assert no_zone.zones == () and no_zone.spot is True
    assert lost_ranks(staying, 4) == (0, 2)
    with pytest.raises(ValueError):
        LaunchRequest(job_id="j", cluster="j", count=2, gpus_per_node=1, public_key="", ranks=(1,))


def test_survivors_and_replacements_make_one_run_by_rank() -> None:
    nodes = joined([node(1), node(3)], [node(2), node(0)])
    assert [i.rank for i in nodes] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="do not make one run"):
        joined([node(1)], [node(1)])  # a provider that ignored the ranks asked for


def test_a_policy_that_wants_another_market_moves_the_whole_cluster() -> None:
    assert market_matches([node(0, market="spot")], True)
    assert not market_matches([node(0, market="spot")], False)
    assert market_matches([node(0, market="on-demand")], None)  # no policy: the spec's choice


def test_a_zone_aware_policy_that_wants_another_zone_moves_the_whole_cluster() -> None:
    assert market_matches([node(0, zone="us-east-1b")], True, "us-east-1b")
    assert not market_matches([node(0, zone="us-east-1b")], True, "us-east-1a")
    assert market_matches([node(0, zone=None)], True, "us-east-1a")  # a provider without zones


def test_a_survivor_is_readied_for_the_restart_keeping_its_log_and_checkpoints(
    tmp_path: Path,
) -> None:
    layout = NodeLayout("j-1")
    run = tmp_path / layout.run_dir
    agent = tmp_path / layout.root / "checkpoint-agent"
    ckpt = tmp_path / layout.root / "ckpt" / "step-000010"
    for directory in (run, agent, ckpt):
        directory.mkdir(parents=True)
    (run / "node.log").write_text("[default0]:step 10\n")
    (run / "exit_code").write_text("143\n")
    (run / "launch.sh").write_text("echo 'step 11'\n")
    (agent / "manifest.json").write_text("{}")
    (ckpt / "model.pt").write_bytes(b"weights")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (run / "pid").write_text(f"{sleeper.pid}\n")  # what is left of the run
    env = {**os.environ, "HOME": str(tmp_path)}
    try:
        subprocess.run(["bash", "-c", rerun_command(layout)], env=env, cwd=tmp_path, check=True)
        assert sleeper.wait(timeout=10) == -9  # the run's session killed
    finally:
        sleeper.kill()
    assert sorted(p.name for p in run.iterdir()) == ["node.log"]
    assert not agent.exists() and (ckpt / "model.pt").read_bytes() == b"weights"
    (run / "launch.sh").write_text("echo 'step 11'\n")
    started = subprocess.run(
        ["bash", "-c", start_command(layout)], env=env, cwd=tmp_path, check=True,
        capture_output=True, text=True,
    )  # fmt: skip
    assert started.stdout.strip().isdigit()
    for _ in range(100):
        if "step 11" in (run / "node.log").read_text():
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert (run / "node.log").read_text() == "[default0]:step 10\nstep 11\n"  # appended


def test_the_workdir_sync_keeps_a_checkpoint_directory_inside_it(tmp_path: Path) -> None:
    """rsync --delete makes the node's workdir the local one, but for `protect`."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    (local / "ckpt").mkdir(parents=True)
    (local / "train.py").write_text("print()\n")
    (remote / "ckpt" / "step-000010").mkdir(parents=True)
    (remote / "ckpt" / "step-000010" / "model.pt").write_bytes(b"weights")
    (remote / "stale.py").write_text("old\n")
    identity = Identity(tmp_path / "key", "ssh-ed25519 K", tmp_path / "known", tmp_path)
    address = HostAddress("n0", "127.0.0.1", 22, "orch", "ssh-ed25519 K")
    argv = push_argv(local, address, identity, "workdir", workdir=True, protect=["ckpt"])
    assert "--filter=P /ckpt/***" in argv and "--delete" in argv
    transport = argv.index("-e")
    local_argv = [*argv[:transport], *argv[transport + 2 : -1], f"{remote}/"]  # no ssh here
    subprocess.run(local_argv, check=True)
    assert (remote / "ckpt" / "step-000010" / "model.pt").read_bytes() == b"weights"
    assert not (remote / "stale.py").exists() and (remote / "train.py").exists()
    unprotected = [arg for arg in local_argv if not arg.startswith("--filter=P ")]
    subprocess.run(unprotected, check=True)
    assert not (remote / "ckpt" / "step-000010").exists()  # what the filter prevented
