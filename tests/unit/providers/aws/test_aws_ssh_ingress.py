"""Who may reach the nodes' SSH: the `aws.ssh_cidr` setting, its default, and the `orch`
security group's ingress on each launch: the owner's rule added, its stale ones expired, other
owners' kept, SSH between members, nothing else. Pure, no network."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import AwsSettings, load_settings
from orchestrator.errors import ConfigError
from orchestrator.providers.aws.network import is_local_endpoint, ssh_cidr
from orchestrator.providers.aws.ssh_rules import (
    REFRESH_AFTER_S,
    SSH_RULE_TTL_S,
    ingress_plan,
    owner_label,
    parse_description,
    rule_description,
)

GROUP = "sg-0123"
MEMBERS_SSH_BARE = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                    "UserIdGroupPairs": [{"GroupId": GROUP}]}  # fmt: skip
MEMBERS_SSH = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
               "UserIdGroupPairs": [{"GroupId": GROUP, "UserId": "123"}]}  # fmt: skip


def test_ssh_from_anywhere_needs_consent_and_addresses_are_checked(tmp_path: Path) -> None:
    assert AwsSettings().ssh_cidr is None  # no 0.0.0.0/0 default any more
    assert AwsSettings(ssh_cidr="198.51.100.7").ssh_cidr == "198.51.100.7/32"
    assert AwsSettings(ssh_cidr="2001:db8::/64").ssh_cidr == "2001:db8::/64"
    (tmp_path / "config.yaml").write_text("aws: {ssh_cidr: 0.0.0.0/0}\n")
    with pytest.raises(ConfigError, match="anyone on the internet") as caught:
        load_settings({"ORCH_HOME": str(tmp_path)})
    assert "ssh_from_anywhere" in str(caught.value)
    (tmp_path / "config.yaml").write_text("aws: {ssh_cidr: 0.0.0.0/0, ssh_from_anywhere: true}\n")
    assert load_settings({"ORCH_HOME": str(tmp_path)}).aws.ssh_cidr == "0.0.0.0/0"
    for bad in ("198.51.100.7/24", "my-laptop", "::/0"):
        with pytest.raises(ConfigError, match="ssh_cidr"):
            load_settings({"ORCH_HOME": str(tmp_path / "none"), "ORCH_AWS_SSH_CIDR": bad})
    env = {"ORCH_HOME": str(tmp_path / "none"), "ORCH_AWS_SSH_CIDR": "203.0.113.9/32"}
    assert load_settings(env).aws.ssh_cidr == "203.0.113.9/32"


def test_an_unset_ssh_cidr_is_an_error_that_says_how_to_set_it_on_a_real_cloud() -> None:
    for endpoint in (None, "https://10.1.2.3:443"):
        with pytest.raises(ConfigError, match="aws.ssh_cidr is not set") as caught:
            ssh_cidr(AwsSettings(endpoint_url=endpoint), "172.31.0.0/16")
        assert "ORCH_AWS_SSH_CIDR" in (caught.value.hint or "")
        assert "/32" in (caught.value.hint or "")
    assert ssh_cidr(AwsSettings(ssh_cidr="203.0.113.9"), "172.31.0.0/16") == "203.0.113.9/32"


def test_a_cloud_on_this_machine_gets_this_machine_s_own_address() -> None:
    assert is_local_endpoint("http://127.0.0.1:5000") and is_local_endpoint("http://localhost:1")
    assert not is_local_endpoint(None) and not is_local_endpoint("https://10.0.0.1")
    # toward a loopback "VPC" the route's source is the loopback address itself
    assert ssh_cidr(AwsSettings(endpoint_url="http://127.0.0.1:5000"), "127.0.0.0/8") == (
        "127.0.0.1/32"
    )


NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _ssh(cidr: str, owner: str | None, at: datetime = NOW) -> dict:
    source = {"CidrIp": cidr}
    if owner is not None:
        source["Description"] = rule_description(owner, at)
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [source]}


def _plan(permissions: list[dict], cidr: str = "198.51.100.7/32", owner: str = "alice") -> Any:
    return ingress_plan(permissions, GROUP, owner=owner, cidr=cidr, now=NOW)


def test_a_rule_names_its_owner_and_time_in_what_ec2_takes() -> None:
    text = rule_description("Ann O'Neil <ann@example.com>", NOW)
    assert re.fullmatch(r"[A-Za-z0-9 ._\-:/()#,@\[\]+=&;{}!$*]+", text), text
    assert parse_description(text) == (owner_label("Ann O'Neil <ann@example.com>"), NOW)
    assert parse_description("SSH from the controller") is None
    assert parse_description(None) is None


def test_a_right_group_is_left_alone() -> None:
    assert _plan([_ssh("198.51.100.7/32", "alice"), MEMBERS_SSH]).empty


def test_a_new_group_gets_ssh_between_members_and_the_owner_s_rule() -> None:
    plan = _plan([])
    assert plan.revoke == [] and plan.refresh == []
    assert plan.authorize == [MEMBERS_SSH_BARE, _ssh("198.51.100.7/32", "alice")]


def test_another_owner_s_rules_are_never_revoked_however_old() -> None:
    ancient = NOW - timedelta(days=400)
    plan = _plan([_ssh("203.0.113.9/32", "bob", ancient), MEMBERS_SSH])
    assert plan.revoke == [] and plan.authorize == [_ssh("198.51.100.7/32", "alice")]


def test_the_owner_s_rules_from_elsewhere_expire_after_the_ttl_only() -> None:
    fresh = NOW - timedelta(seconds=SSH_RULE_TTL_S - 60)
    stale = NOW - timedelta(seconds=SSH_RULE_TTL_S + 60)
    plan = _plan([_ssh("192.0.2.1/32", "alice", fresh), _ssh("192.0.2.2/32", "alice", stale),
                  MEMBERS_SSH])  # fmt: skip
    assert plan.revoke == [_bare("192.0.2.2/32")]
    assert plan.authorize == [_ssh("198.51.100.7/32", "alice")]


def test_the_owner_s_rule_in_use_is_confirmed_now_and_then() -> None:
    old = NOW - timedelta(seconds=REFRESH_AFTER_S + 1)
    plan = _plan([_ssh("198.51.100.7/32", "alice", old), MEMBERS_SSH])
    assert plan.revoke == [] and plan.authorize == []
    assert plan.refresh == [_ssh("198.51.100.7/32", "alice")]
    # an address another owner's rule admits already is not added twice (EC2 keeps one)
    assert _plan([_ssh("198.51.100.7/32", "bob", old), MEMBERS_SSH]).empty


def test_rules_that_are_no_owner_s_are_revoked() -> None:
    wide = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
            "IpRanges": [{"CidrIp": "0.0.0.0/0", "Description": "x"}],
            "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}  # fmt: skip
    stray = {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
             "UserIdGroupPairs": [{"GroupId": "sg-other"}]}  # fmt: skip
    everything = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": GROUP, "UserId": "1"}]}
    plan = _plan([wide, stray, everything, MEMBERS_SSH, _ssh("198.51.100.7/32", "alice")])
    assert plan.revoke == [
        _bare("0.0.0.0/0"),
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "Ipv6Ranges": [{"CidrIpv6": "::/0"}]},
        {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
         "UserIdGroupPairs": [{"GroupId": "sg-other"}]},
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": GROUP}]},
    ]  # fmt: skip
    assert plan.authorize == []


def test_an_ipv6_address_gets_an_ipv6_rule() -> None:
    plan = _plan([MEMBERS_SSH], cidr="2001:db8::/64")
    [rule] = plan.authorize
    assert rule["Ipv6Ranges"][0]["CidrIpv6"] == "2001:db8::/64"
    assert parse_description(rule["Ipv6Ranges"][0]["Description"]) == ("alice", NOW)


def _bare(cidr: str) -> dict:
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": cidr}]}
