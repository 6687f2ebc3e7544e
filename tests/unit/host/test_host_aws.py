"""The AWS controller host's pure parts: its systemd unit, its settings (never the laptop's
AWS credentials), its tags (never a job's) and its price."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.errors import ConfigError, ControllerHostError
from orchestrator.host.aws_host import aws_host_environment
from orchestrator.host.layout import HostLayout, start_command, stop_command
from orchestrator.host.lifecycle import host_environment
from orchestrator.host.systemd import install_command, unit_text
from orchestrator.providers.aws.catalog import load_catalog
from orchestrator.providers.aws.ec2_requests import TAG_JOB, instance_from_description
from orchestrator.providers.aws.host_node import HOST_TYPE_PRICES, host_price, host_tags

LAYOUT = HostLayout("/home/ubuntu/.orch-host")


def test_the_unit_restarts_the_daemon_always_unless_it_stopped_on_purpose() -> None:
    text = unit_text(LAYOUT, "ubuntu")
    lines = text.splitlines()
    assert "[Service]" in lines and "[Install]" in lines
    assert "Restart=always" in lines and "User=ubuntu" in lines
    assert "WantedBy=multi-user.target" in lines
    assert "ExecCondition=/bin/sh -c '! test -e /home/ubuntu/.orch-host/stop'" in lines
    (start,) = [line for line in lines if line.startswith("ExecStart=")]
    assert start == (
        "ExecStart=/bin/sh -c '. /home/ubuntu/.orch-host/env && exec "
        "/home/ubuntu/.orch-host/venv/bin/python -m orchestrator.host.daemon "
        "--root /home/ubuntu/.orch-host >> /home/ubuntu/.orch-host/daemon.log 2>&1'"
    )


def test_a_root_a_unit_cannot_carry_is_refused() -> None:
    with pytest.raises(ControllerHostError):
        unit_text(HostLayout("/home/a b/.orch-host"), "ubuntu")
    with pytest.raises(ControllerHostError):
        unit_text(LAYOUT, "x;rm")


def test_start_and_stop_use_the_unit_where_it_is_installed() -> None:
    unit = "/etc/systemd/system/orch-controller.service"
    assert f"[ -f {unit} ]" in start_command(LAYOUT) and "systemctl restart" in start_command(
        LAYOUT
    )
    assert "systemctl stop orch-controller.service" in stop_command(LAYOUT)
    assert "sudo -n systemctl enable --now orch-controller.service" in install_command(LAYOUT)
    assert f"tee {unit}" in install_command(LAYOUT)


def test_the_host_gets_no_aws_credential_of_the_laptop() -> None:
    laptop = {
        "AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
        "AWS_PROFILE": "p", "AWS_SHARED_CREDENTIALS_FILE": "/c", "AWS_CONFIG_FILE": "/f",
        "ORCH_AWS_ENDPOINT_URL": "http://127.0.0.1:5000", "ORCH_AWS_TF_OUTPUTS": "/laptop/tf.json",
        "ORCH_AWS_CONTROLLER_INSTANCE_PROFILE": "orch-controller", "ORCH_WATCH_INTERVAL": "1",
        "ORCH_HOME": "/laptop/.orch",
    }  # fmt: skip
    env = aws_host_environment(
        host_environment(laptop), endpoint_url="http://10.1.0.1:5000", ssh_cidr="10.1.0.1/32"
    )
    assert not [k for k in env if not k.startswith("ORCH_")]
    assert env["ORCH_AWS_ENDPOINT_URL"] == "http://10.1.0.1:5000"
    assert env["ORCH_AWS_SSH_CIDR"] == "10.1.0.1/32" and env["ORCH_WATCH_INTERVAL"] == "1"
    for gone in ("ORCH_HOME", "ORCH_AWS_TF_OUTPUTS", "ORCH_AWS_CONTROLLER_INSTANCE_PROFILE"):
        assert gone not in env
    # inside the VPC the host reaches the nodes at their private IPs (the group admits its
    # members; its SSH rule admits only the laptop's address)
    assert env["ORCH_AWS_CONNECT_PRIVATE"] == "true"


def test_a_controller_inside_the_vpc_connects_to_the_private_ip() -> None:
    desc = {
        "InstanceId": "i-1", "PrivateIpAddress": "10.42.0.7", "PublicIpAddress": "198.51.100.7",
        "Tags": [{"Key": "orch-job", "Value": "job"}],
    }  # fmt: skip
    laptop = instance_from_description(desc, ssh_user="ubuntu", interface="ens5")
    host = instance_from_description(
        desc, ssh_user="ubuntu", interface="ens5", connect_private=True
    )
    assert laptop is not None and laptop.ssh_host == "198.51.100.7"
    assert host is not None and host.ssh_host == "10.42.0.7"


def test_the_host_is_tagged_as_orch_s_but_never_as_a_job_s_node() -> None:
    tags = host_tags(
        "controller-host", owner="ana", host_key="ssh-ed25519 AAAA", price=Decimal("0.02"),
        token="tok",
    )  # fmt: skip
    assert TAG_JOB not in tags
    assert tags["orch-role"] == "controller-host" and tags["orch-owner"] == "ana"
    assert tags["orch-price"] == "0.02" and tags["orch-market"] == "on-demand"


def test_the_host_s_price_comes_from_the_catalog_or_the_small_types() -> None:
    catalog = load_catalog()
    first = catalog.types[0]
    region = next(iter(first.on_demand))
    assert host_price(catalog, first.name, region) == first.on_demand[region]
    assert host_price(catalog, "t3.small", "us-east-1") == HOST_TYPE_PRICES["t3.small"]
    with pytest.raises(ConfigError):
        host_price(catalog, "x9.huge", "us-east-1")
