"""Who may reach the nodes' SSH: the `aws.ssh_cidr` setting, its default, and the `orch`
security group's rules set back to exactly orch's two on each launch. Pure, no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import AwsSettings, load_settings
from orchestrator.errors import ConfigError
from orchestrator.providers.aws.network import ingress_plan, is_local_endpoint, ssh_cidr

GROUP = "sg-0123"
SSH_FROM_ME = {
    "IpProtocol": "tcp",
    "FromPort": 22,
    "ToPort": 22,
    "IpRanges": [{"CidrIp": "198.51.100.7/32", "Description": "SSH from the controller"}],
}
MEMBERS = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": GROUP, "UserId": "123"}]}


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


def test_a_right_group_is_left_alone() -> None:
    assert ingress_plan([SSH_FROM_ME, MEMBERS], GROUP, "198.51.100.7/32") == ([], [])


def test_a_new_group_gets_its_two_rules() -> None:
    revoke, authorize = ingress_plan([], GROUP, "198.51.100.7/32")
    assert revoke == []
    assert authorize == [
        SSH_FROM_ME,
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": GROUP}]},
    ]


def test_a_wide_or_stray_rule_is_revoked_and_the_wanted_one_authorized() -> None:
    old = {
        "IpProtocol": "tcp",
        "FromPort": 22,
        "ToPort": 22,
        "IpRanges": [{"CidrIp": "0.0.0.0/0", "Description": "x"}, {"CidrIp": "198.51.100.7/32"}],
        "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
    }
    stray = {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
             "UserIdGroupPairs": [{"GroupId": "sg-other"}]}  # fmt: skip
    revoke, authorize = ingress_plan([old, stray, MEMBERS], GROUP, "198.51.100.7/32")
    assert revoke == [
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "Ipv6Ranges": [{"CidrIpv6": "::/0"}]},
        {"IpProtocol": "tcp", "FromPort": 8080, "ToPort": 8080,
         "UserIdGroupPairs": [{"GroupId": "sg-other"}]},
    ]  # fmt: skip
    assert authorize == []  # the /32 was there already, among the others
    revoke, authorize = ingress_plan([SSH_FROM_ME, MEMBERS], GROUP, "2001:db8::/64")
    assert revoke == [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                       "IpRanges": [{"CidrIp": "198.51.100.7/32"}]}]  # fmt: skip
    assert authorize[0]["Ipv6Ranges"][0]["CidrIpv6"] == "2001:db8::/64"
