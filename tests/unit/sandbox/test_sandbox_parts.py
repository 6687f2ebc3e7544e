"""The pure parts of the sandbox: network plan, price table, capacity, EC2 wire format, hosts."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from ipaddress import IPv4Network
from pathlib import Path

import botocore.parsers
import botocore.session
import pytest

from orchestrator.providers.aws.catalog import load_catalog
from orchestrator.providers.aws.ec2_requests import new_host_key, user_data
from orchestrator.sandbox import ec2_wire as wire
from orchestrator.sandbox import hostnet
from orchestrator.sandbox.capacity import Capacity, markets_named
from orchestrator.sandbox.network import SandboxNetwork
from orchestrator.sandbox.pricing import price_table

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
IID = "i-0123456789abcdef0"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE0RyllzbbaRzY/uF8W6tE5Fz9/muW2qq9aowFgJy0y1"


def parse(xml: bytes, operation: str, status: int = 200) -> dict:
    """Parse a response the way boto3 does (botocore's EC2 parser and the EC2 model)."""
    model = botocore.session.get_session().get_service_model("ec2")
    shape = model.operation_model(operation).output_shape
    return botocore.parsers.create_parser("ec2").parse(
        {"body": xml, "headers": {}, "status_code": status}, shape
    )


# --- network --------------------------------------------------------------------------------------


def test_network_plan_keeps_the_bridge_out_of_every_subnet() -> None:
    net = SandboxNetwork()
    assert net.cidr == IPv4Network("10.214.0.0/16") and net.bridge == "orchsbx0"
    assert str(net.gateway) == "10.214.0.1" and net.bridge_cidr == "10.214.0.1/16"
    plan = net.subnets(ZONES)
    assert {z: str(s) for z, s in plan.items()} == {
        "us-east-1a": "10.214.1.0/24",
        "us-east-1b": "10.214.2.0/24",
        "us-east-1c": "10.214.3.0/24",
    }
    assert all(net.gateway not in subnet for subnet in plan.values())
    assert net.holds("10.214.2.9") and not net.holds("10.214.0.1")
    assert not net.holds("10.213.0.5") and not net.holds("garbage")
    with pytest.raises(ValueError, match="no room"):
        SandboxNetwork(cidr=IPv4Network("10.9.0.0/23")).subnets(ZONES)


def test_the_sandbox_network_is_not_the_local_providers() -> None:
    from orchestrator.config import LocalSettings

    local = LocalSettings()
    assert SandboxNetwork().bridge != local.bridge
    assert not SandboxNetwork().cidr.overlaps(local.subnet)


# --- prices -------------------------------------------------------------------------------------


def test_price_table_spot_is_a_growing_share_of_on_demand_per_zone() -> None:
    catalog = load_catalog()
    table = price_table(catalog, "us-east-1", ZONES)
    g5 = catalog.get("g5.xlarge")
    assert g5 is not None
    on_demand = g5.on_demand["us-east-1"]
    assert table.price("us-east-1a", "g5.xlarge", "on-demand") == on_demand
    shares = [Decimal("0.30"), Decimal("0.33"), Decimal("0.36")]
    for zone, share in zip(ZONES, shares, strict=True):
        assert table.price(zone, "g5.xlarge", "spot") == (on_demand * share).quantize(
            Decimal("0.0001")
        )
    for itype in table.on_demand:  # the first zone is always the cheapest spot offer
        spots = [table.spot[(zone, itype)] for zone in ZONES]
        assert spots == sorted(spots) and spots[-1] < table.on_demand[itype]
    assert table.price("us-east-1d", "g5.xlarge", "spot") is None
    assert table.price("us-east-1a", "x9.nothing", "on-demand") is None
    assert {t.name for t in catalog.types if "us-east-1" in t.on_demand} == set(table.on_demand)
    row = next(r for r in table.rows() if r["instance_type"] == "g5.xlarge")
    assert row == {
        "zone": "us-east-1a",
        "instance_type": "g5.xlarge",
        "spot": str(table.spot[("us-east-1a", "g5.xlarge")]),
        "on_demand": str(on_demand),
    }


def test_a_region_the_catalog_does_not_sell_has_no_prices() -> None:
    table = price_table(load_catalog(), "xx-nowhere-1", ["xx-nowhere-1a"])
    assert list(table.offerings()) == []


# --- capacity -----------------------------------------------------------------------------------


def test_capacity_is_refused_per_zone_and_market_until_restored() -> None:
    capacity = Capacity()
    assert not capacity.refuses("us-east-1a", "spot")
    capacity.set(["us-east-1a"], "spot", available=False)
    assert capacity.refuses("us-east-1a", "spot")
    assert not capacity.refuses("us-east-1a", "on-demand")
    assert not capacity.refuses("us-east-1b", "spot")
    capacity.set(["us-east-1b", "us-east-1c"], "all", available=False)
    assert capacity.refused() == [
        {"zone": "us-east-1a", "market": "spot"},
        {"zone": "us-east-1b", "market": "on-demand"},
        {"zone": "us-east-1b", "market": "spot"},
        {"zone": "us-east-1c", "market": "on-demand"},
        {"zone": "us-east-1c", "market": "spot"},
    ]
    capacity.set(["us-east-1a", "us-east-1b", "us-east-1c"], "all", available=True)
    assert capacity.refused() == []
    assert markets_named("all") == ("spot", "on-demand")
    with pytest.raises(ValueError, match="unknown market"):
        markets_named("reserved")


# --- the EC2 wire format ------------------------------------------------------------------------


def test_query_parameters_lists_filters_and_region() -> None:
    body = (
        b"Action=DescribeSpotPriceHistory&Version=2016-11-15&InstanceType.2=g5.2xlarge"
        b"&InstanceType.1=g5.xlarge&ProductDescription.1=Linux%2FUNIX"
        b"&Filter.1.Name=availability-zone&Filter.1.Value.1=us-east-1b"
        b"&Filter.1.Value.2=us-east-1c&Filter.2.Name=instance-type&Filter.2.Value.1=p5.48xlarge"
    )
    params = wire.request_params(body, "Extra=1")
    assert params["Action"] == "DescribeSpotPriceHistory" and params["Extra"] == "1"
    assert wire.list_param(params, "InstanceType") == ["g5.xlarge", "g5.2xlarge"]
    assert wire.list_param(params, "ProductDescription") == ["Linux/UNIX"]
    assert wire.filters(params) == {
        "availability-zone": ["us-east-1b", "us-east-1c"],
        "instance-type": ["p5.48xlarge"],
    }
    auth = (
        "AWS4-HMAC-SHA256 Credential=sandbox/20261130/eu-west-3/ec2/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=abc"
    )
    assert wire.region_of(auth, "us-east-1") == "eu-west-3"
    assert wire.region_of(None, "us-east-1") == "us-east-1"


def test_answers_parse_as_boto3_reads_them() -> None:
    at = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    history = parse(
        wire.spot_price_history_xml([("us-east-1a", "g5.xlarge", Decimal("0.3018"))], at),
        "DescribeSpotPriceHistory",
    )["SpotPriceHistory"]
    assert history == [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "g5.xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "0.3018",
            "Timestamp": at,
        }
    ]
    offerings = parse(
        wire.instance_type_offerings_xml([("g5.xlarge", "us-east-1b")], "availability-zone"),
        "DescribeInstanceTypeOfferings",
    )["InstanceTypeOfferings"]
    assert offerings == [
        {"InstanceType": "g5.xlarge", "LocationType": "availability-zone", "Location": "us-east-1b"}
    ]
    error = parse(
        wire.error_xml("InsufficientInstanceCapacity", "none <left>"), "RunInstances", 500
    )
    assert error["Error"] == {"Code": "InsufficientInstanceCapacity", "Message": "none <left>"}


def test_launched_ids_are_read_from_a_run_instances_answer() -> None:
    xml = (
        f'<RunInstancesResponse xmlns="{wire.EC2_XMLNS}"><reservationId>r-1</reservationId>'
        "<instancesSet><item><instanceId>i-aaa111</instanceId><networkInterfaceSet><item>"
        "<attachment><instanceId>i-not-this</instanceId></attachment></item>"
        "</networkInterfaceSet></item><item><instanceId>i-bbb222</instanceId></item>"
        "</instancesSet></RunInstancesResponse>"
    ).encode()
    assert wire.launched_instance_ids(xml) == ["i-aaa111", "i-bbb222"]
    assert wire.launched_instance_ids(b"not xml") == []


# --- hosts --------------------------------------------------------------------------------------


def test_names_of_a_host() -> None:
    assert hostnet.netns_name(IID) == "osbx-" + IID
    veth = hostnet.veth_name(IID)
    assert veth.startswith("sx") and len(veth) <= 15
    assert veth == hostnet.veth_name(IID) != hostnet.veth_name("i-0123456789abcdef1")
    assert hostnet.is_instance_id(IID) and hostnet.is_instance_id("i-1234abcd")
    for bad in ("l-0123456789", "i-../etc", "i-XYZ12345", "i-12", ""):
        assert not hostnet.is_instance_id(bad)


def test_host_network_puts_the_private_ip_on_ens5_and_metadata_on_lo() -> None:
    net = SandboxNetwork()
    argvs = hostnet.host_net_setup_argvs(IID, "10.214.2.7", net)
    ns, veth = "osbx-" + IID, hostnet.veth_name(IID)
    assert argvs[0] == ["ip", "netns", "add", ns]
    assert ["ip", "link", "set", "dev", veth, "master", "orchsbx0"] in argvs
    assert ["ip", "-n", ns, "addr", "add", "10.214.2.7/16", "dev", "ens5"] in argvs
    assert ["ip", "-n", ns, "addr", "add", "169.254.169.254/32", "dev", "lo"] in argvs
    assert argvs[-1] == ["ip", "-n", ns, "route", "add", "default", "via", "10.214.0.1"]
    assert hostnet.link_down_argv(IID) == ["ip", "link", "set", "dev", veth, "down"]
    assert hostnet.host_net_teardown_argvs(IID) == [
        ["ip", "link", "del", "dev", veth],
        ["ip", "netns", "del", ns],
    ]


def test_host_init_mounts_the_host_files_then_starts_metadata_and_sshd(tmp_path: Path) -> None:
    files = hostnet.HostFiles(
        disk=tmp_path / "disk",
        etc=tmp_path / "etc",
        sshd_config=tmp_path / "sshd_config",
        sshd_log=tmp_path / "sshd.log",
        notice_file=tmp_path / "notice.json",
        imds_ready=tmp_path / "imds.ready",
        imds_log=tmp_path / "imds.log",
    )
    argv = hostnet.host_init_argv(IID, files, "/srv/home", "/usr/sbin/sshd", "/venv/python")
    assert argv[:8] == ["ip", "netns", "exec", "osbx-" + IID, "unshare", "--mount",
                        "--propagation", "private"]  # fmt: skip
    script, args = argv[10], argv[12:]
    assert "orchestrator.node.imds_server --bind 169.254.169.254 --port 80" in script
    assert script.rstrip().splitlines()[-1].startswith('exec "$9" -D')
    assert args == [
        str(files.disk), "/srv/home", str(files.etc), "/venv/python", IID,
        str(files.notice_file), str(files.imds_ready), str(files.imds_log), "/usr/sbin/sshd",
        str(files.sshd_config), str(files.sshd_log), "", "",
    ]  # fmt: skip
    with_role = hostnet.host_init_argv(IID, files, "/h", "/sshd", "/py", role="orch-node")
    assert with_role[-2] == "orch-node"
    booted = hostnet.host_init_argv(IID, files, "/h", "/sshd", "/py", boot=tmp_path / "boot.sh")
    assert booted[-1] == str(tmp_path / "boot.sh")
    # The boot script runs after the mounts, before the metadata endpoint and sshd start.
    assert script.index("/etc/resolv.conf") < script.index('sh "${13}"') < script.index("imds")
    # The metadata endpoint gets --role only when there is one (sh expands the 12th argument).
    metadata_line = next(line for line in script.splitlines() if "imds_server" in line)
    role_part = metadata_line[metadata_line.index("${12:+") :].split(" </dev/null")[0]
    for role, expected in (("orch-node", "--role orch-node"), ("", "")):
        shown = subprocess.run(
            ["sh", "-c", f"echo {role_part}", "x", *[str(i) for i in range(1, 12)], role],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert shown == expected


def test_passwd_gives_the_image_user_uid_0_and_the_disk_as_home() -> None:
    host = "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n"
    text = hostnet.passwd_text(host, "/srv/home", "/bin/bash")
    assert text.splitlines() == [
        "root:x:0:0:root:/root:/bin/bash",
        "ubuntu:x:0:0:ubuntu:/srv/home:/bin/bash",
    ]


def test_cloud_config_of_orchs_user_data_yields_its_keys() -> None:
    host_key = new_host_key()
    config = hostnet.parse_cloud_config(user_data(KEY + " orch-job", host_key))
    assert config.authorized_keys == (KEY + " orch-job",)
    assert config.host_keys == {"ed25519": (host_key.private_openssh, host_key.public_line)}
    for other in ("#!/bin/sh\necho hi\n", "", "#cloud-config\n[1, 2]\n", "#cloud-config\n: :\n"):
        assert hostnet.parse_cloud_config(other) == hostnet.CloudConfig()


def test_authorized_keys_lists_each_key_once() -> None:
    config = hostnet.CloudConfig(authorized_keys=(KEY + " from-user-data", "ssh-rsa BBBB x"))
    text = hostnet.authorized_keys_text(KEY + " key-pair", config)
    assert text == f"{KEY} key-pair\nssh-rsa BBBB x\n"
    assert hostnet.authorized_keys_text(None, hostnet.CloudConfig()) == ""


def test_notice_is_what_ec2_serves() -> None:
    at = datetime(2026, 11, 30, 10, 2, 3, 456000, tzinfo=UTC)
    assert hostnet.notice_document(at) == {"action": "terminate", "time": "2026-11-30T10:02:03Z"}


def test_cloud_config_write_files_and_runcmd_as_cloud_init_reads_them(tmp_path: Path) -> None:
    import base64
    import gzip

    from orchestrator.node.guard_protocol import GuardTerms, guard_program

    terms = GuardTerms("j", 1, 10, 100, 600, 5, 0, 5, 10).for_node(
        now=datetime.now(UTC), hourly_usd=Decimal(1), poweroff="shutdown -h now", user="ubuntu"
    )
    config = hostnet.parse_cloud_config(user_data(KEY, new_host_key(), terms))
    files = {f.path: f for f in config.write_files}
    assert files["/opt/orch-guard/terms.json"].content.decode() == terms
    program = files["/opt/orch-guard/guard.py"]
    shipped = guard_program()
    assert program.mode == 0o755 and program.content == shipped["guard.py"].encode()
    assert files["/opt/orch-guard/guard_seal.py"].content == shipped["guard_seal.py"].encode()
    assert "systemctl enable --now orch-guard.service" in config.runcmd[0]
    packed = base64.b64encode(gzip.compress(b"x")).decode()
    odd = hostnet.parse_cloud_config(
        "#cloud-config\n" + json.dumps({
            "write_files": [
                {"path": "relative", "content": "no"},
                {"path": "/a/../etc/shadow", "content": "no"},
                {"path": "/etc/passwd", "content": "no"},
                {"path": "/opt/x/ok", "content": packed, "encoding": "gz+b64",
                 "permissions": "0600"},
                {"path": "/bad", "content": "not base64!", "encoding": "b64"},
            ],
            "runcmd": ["echo a", ["echo", "b c"], 3],
        })
    )  # fmt: skip
    assert [(f.path, f.content, f.mode) for f in odd.write_files] == [("/opt/x/ok", b"x", 0o600)]
    assert odd.runcmd == ("echo a", "echo 'b c'")
    script = hostnet.boot_script(odd, tmp_path / "root", tmp_path / "sbin", "/srv/home", "/bin")
    lines = script.splitlines()
    assert lines[1] == f"mount --bind {tmp_path / 'sbin'} /usr/local/sbin"
    assert lines[2] == f"mkdir -p /opt/x && mount --bind {tmp_path / 'root'}/opt/x /opt/x"
    assert "HOME=/srv/home" in lines[3] and "setsid sh -c" in lines[3]


def test_a_hosts_shutdown_asks_the_sandbox_and_never_runs_this_machines(tmp_path: Path) -> None:
    shutdown = tmp_path / "shutdown"
    shutdown.write_text(hostnet.shutdown_script(tmp_path))
    shutdown.chmod(0o755)
    out = subprocess.run([str(shutdown), "-h", "now"], capture_output=True, text=True, check=True)
    assert "shuts down" in out.stdout
    assert (tmp_path / hostnet.SHUTDOWN_REQUEST).read_text() == "shutdown -h now\n"
