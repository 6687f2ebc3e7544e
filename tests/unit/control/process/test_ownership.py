"""Whose nodes are whose: the pure partition by ledger, the identity check, the ledger's id."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.control.process.ownership import check_identity, is_ours, not_ours_line, partition
from orchestrator.errors import IdentityMismatch, OrchError
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.aws.ec2_requests import (
    TAG_LEDGER,
    TAG_OWNER,
    client_token,
    instance_from_description,
    node_tags,
)
from orchestrator.providers.base import CloudIdentity, Instance, LaunchRequest
from orchestrator.providers.offers import Offer


def node(instance_id: str, ledger_id: str | None) -> Instance:
    return Instance(
        instance_id=instance_id, job_id="job", cluster="job", rank=0, private_ip="10.0.0.1",
        ssh_host="10.0.0.1", ssh_port=22, ssh_user="ubuntu", host_key="", interface="ens5",
        market="on-demand", instance_type="g5.xlarge", price_per_hour=Decimal("1"),
        launched_at=datetime(2024, 1, 1, tzinfo=UTC), ledger_id=ledger_id,
    )  # fmt: skip


def test_only_nodes_tagged_with_this_ledger_are_ours() -> None:
    mine, theirs, untagged = node("i-1", "aaaa"), node("i-2", "bbbb"), node("i-3", None)
    split = partition([theirs, mine, untagged], "aaaa")
    assert split.ours == [mine]
    assert split.others == [theirs, untagged]


def test_an_untagged_node_is_ours_only_when_this_ledger_leased_it() -> None:
    legacy = node("i-3", None)
    assert is_ours(legacy, "aaaa", frozenset({"i-3"}))
    assert not is_ours(legacy, "aaaa", frozenset({"i-9"}))
    # a lease never claims a node that another ledger's tag names
    assert partition([node("i-2", "bbbb")], "aaaa", leased=["i-2"]).ours == []


def test_the_not_ours_line_counts_and_names_them() -> None:
    assert not_ours_line([]) is None
    assert not_ours_line(["i-2"]) == "1 instance of another ledger: not ours (i-2)"
    assert not_ours_line(["i-3", "i-1", "i-2"]) == (
        "3 instances of another ledger: not ours (i-1, i-2, i-3)"
    )


AWS = CloudIdentity("aws", "123456789012", "us-east-1", "http://127.0.0.1:5000")


def test_identity_round_trips_through_json() -> None:
    assert CloudIdentity.from_json(AWS.to_json()) == AWS
    local = CloudIdentity("local", "host:/home/me/.orch")
    assert CloudIdentity.from_json(local.to_json()) == local
    with pytest.raises(ValueError):
        CloudIdentity.from_json("[]")


def test_the_same_identity_or_none_recorded_passes() -> None:
    check_identity("job", [None, AWS.to_json(), AWS.to_json()], AWS)
    check_identity("job", [], AWS)


@pytest.mark.parametrize(
    "other",
    [
        CloudIdentity("aws", "123456789012", "eu-west-1", "http://127.0.0.1:5000"),
        CloudIdentity("aws", "123456789012", "us-east-1", None),
        CloudIdentity("aws", "999999999999", "us-east-1", "http://127.0.0.1:5000"),
    ],
)
def test_another_identity_is_refused_naming_both(other: CloudIdentity) -> None:
    with pytest.raises(IdentityMismatch) as raised:
        check_identity("job-1", [None, AWS.to_json()], other)
    error = raised.value
    assert isinstance(error, OrchError) and error.hint
    assert AWS.describe() in error.message and other.describe() in error.message
    assert "job-1" in error.message and "shell" in error.hint


def test_an_unreadable_recorded_identity_is_refused() -> None:
    with pytest.raises(IdentityMismatch):
        check_identity("job", ["garbage"], AWS)


def test_a_ledger_gets_one_id_and_keeps_it(tmp_path: Path) -> None:
    first = Ledger(make_engine(tmp_path / "a" / "orch.db")).ledger_id
    assert len(first) >= 16
    assert Ledger(make_engine(tmp_path / "a" / "orch.db")).ledger_id == first
    assert Ledger(make_engine(tmp_path / "b" / "orch.db")).ledger_id != first


OFFER = Offer(
    instance_type="g5.xlarge", region="us-east-1", zone="us-east-1a", market="spot",
    price_per_hour=Decimal("0.5"), on_demand_price=Decimal("1"), gpu="A10G", gpus=1,
    gpu_memory_gib=24, vcpus=4, memory_gib=16,
)  # fmt: skip


def launch_request(ledger_id: str | None) -> LaunchRequest:
    return LaunchRequest(
        job_id="job", cluster="job", count=1, gpus_per_node=1, public_key="ssh-ed25519 AAAA",
        ledger_id=ledger_id,
    )  # fmt: skip


def test_aws_nodes_carry_their_ledger_and_the_owner_as_a_label() -> None:
    request = launch_request("aaaa")
    tags = node_tags(request, 0, OFFER, owner="me", host_key="", token="t")
    assert tags[TAG_LEDGER] == "aaaa" and tags[TAG_OWNER] == "me"
    desc = {
        "InstanceId": "i-1",
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }
    read = instance_from_description(desc, ssh_user="ubuntu", interface="ens5")
    assert read is not None and read.ledger_id == "aaaa"
    untagged = {"InstanceId": "i-2", "Tags": [{"Key": "orch-job", "Value": "job"}]}
    legacy = instance_from_description(untagged, ssh_user="ubuntu", interface="ens5")
    assert legacy is not None and legacy.ledger_id is None


def test_two_ledgers_jobs_of_one_name_never_share_a_launch_token() -> None:
    assert client_token(launch_request("aaaa"), 0, OFFER) != client_token(
        launch_request("bbbb"), 0, OFFER
    )
