"""The pure parts of the local provider: names, addresses, ip argv, sshd_config, records."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from decimal import Decimal
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings, load_settings
from orchestrator.errors import CapacityError, ProviderError
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local import net
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.local.state import NodeRecord, NodeStore

SUBNET = IPv4Network("10.213.0.0/24")


def test_ids_are_random_and_recognised() -> None:
    ids = {net.new_instance_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(net.is_instance_id(i) for i in ids)
    for bad in ("../etc", "l-XYZ", "i-0123456789", "l-0123456789/..", ""):
        assert not net.is_instance_id(bad)


def test_names_of_a_node() -> None:
    assert net.netns_name("l-0123456789") == "orch-l-0123456789"
    veth = net.host_veth_name("l-0123456789")
    assert veth == "ov-0123456789"
    assert len(veth) <= net.IFNAME_MAX
    assert net.host_veth_name("l-abcdefabcd") != veth
    with pytest.raises(ValueError):
        net.host_veth_name("l-" + "a" * 20)


def test_allocation_takes_lowest_free_addresses_after_the_bridge() -> None:
    assert str(net.bridge_address(SUBNET)) == "10.213.0.1"
    assert net.allocate_ips(SUBNET, [], 2) == ["10.213.0.2", "10.213.0.3"]
    used = ["10.213.0.2", "10.213.0.4"]
    assert net.allocate_ips(SUBNET, used, 3) == ["10.213.0.3", "10.213.0.5", "10.213.0.6"]


def test_allocation_never_hands_out_the_bridge_or_a_used_address() -> None:
    got = net.allocate_ips(SUBNET, ["10.213.0.1", "10.213.0.3"], 252)  # 254 hosts - 2
    assert len(set(got)) == 252
    assert "10.213.0.1" not in got and "10.213.0.3" not in got


def test_allocation_reports_a_full_subnet() -> None:
    small = IPv4Network("10.213.7.0/29")  # 6 hosts: bridge + 5 nodes
    assert len(net.allocate_ips(small, [], 5)) == 5
    with pytest.raises(CapacityError, match="5 free addresses, 6 are needed"):
        net.allocate_ips(small, [], 6)


def test_node_network_commands() -> None:
    argvs = net.node_net_setup_argvs("l-0123456789", "10.213.0.5", SUBNET, "orchbr0")
    ns, veth = "orch-l-0123456789", "ov-0123456789"
    assert argvs[0] == ["ip", "netns", "add", ns]
    assert ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns] in argvs
    assert ["ip", "link", "set", "dev", veth, "master", "orchbr0"] in argvs
    assert ["ip", "-n", ns, "addr", "add", "10.213.0.5/24", "dev", "eth0"] in argvs
    assert ["ip", "-n", ns, "link", "set", "dev", "lo", "up"] in argvs
    assert argvs[-1] == ["ip", "-n", ns, "route", "add", "default", "via", "10.213.0.1"]
    assert net.node_net_teardown_argvs("l-0123456789") == [
        ["ip", "link", "del", "dev", veth],
        ["ip", "netns", "del", ns],
    ]


def test_bridge_commands() -> None:
    create = net.bridge_create_argvs("orchbr0", SUBNET)
    assert create[0] == ["ip", "link", "add", "name", "orchbr0", "type", "bridge"]
    assert ["ip", "addr", "replace", "10.213.0.1/24", "dev", "orchbr0"] in create
    assert create[-1] == ["ip", "link", "set", "dev", "orchbr0", "up"]


def test_parse_addresses_of_a_namespace() -> None:
    text = (
        '[{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1"}]},'
        '{"ifname":"eth0","addr_info":[{"family":"inet","local":"10.213.0.9","prefixlen":24}]}]'
    )
    assert net.parse_addr_json(text) == {"10.213.0.9"}
    assert net.parse_addr_json("") == set()
    assert net.parse_addr_json("not json") == set()


def _config(**overrides: object) -> net.SshdConfig:
    fields: dict = {
        "listen": "0.0.0.0:22",
        "host_key": Path("/h/node/key"),
        "authorized_keys": Path("/h/node/authorized_keys"),
        "pid_file": Path("/h/node/sshd.pid"),
        "env": net.node_session_env("l-0123456789", net.NODE_HOME, Path("/venv/bin")),
        "sftp_server": "/usr/lib/openssh/sftp-server",
    }
    fields.update(overrides)
    return net.SshdConfig(**fields)


def test_sshd_config_is_key_only_with_the_node_environment() -> None:
    text = net.sshd_config_text(_config())
    lines = text.splitlines()
    for line in (
        "ListenAddress 0.0.0.0:22",
        'HostKey "/h/node/key"',
        'AuthorizedKeysFile "/h/node/authorized_keys" "/run/orch-node/.ssh/authorized_keys"',
        "PasswordAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "ClientAliveInterval 5",
        "ClientAliveCountMax 3",
        "MaxSessions 64",
        "MaxStartups 64",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
    ):
        assert line in lines
    set_env = next(line for line in lines if line.startswith("SetEnv "))
    assert '"HOME=/run/orch-node"' in set_env
    assert '"ORCH_LOCAL_NODE=l-0123456789"' in set_env
    assert '"PATH=/run/orch-node/bin:/venv/bin:/usr/local/sbin:' in set_env
    assert not any(line.startswith("AcceptEnv") for line in lines)
    assert f"ForceCommand {net.SESSION_COMMAND}" in lines


def test_sshd_config_without_external_sftp_server_has_no_force_command() -> None:
    text = net.sshd_config_text(_config(sftp_server=None))
    assert "Subsystem sftp internal-sftp" in text
    assert "ForceCommand" not in text


def test_sshd_config_escapes_and_refuses_what_it_cannot_write() -> None:
    text = net.sshd_config_text(_config(authorized_keys=Path("/h/100%/keys")))
    assert 'AuthorizedKeysFile "/h/100%%/keys"' in text
    with pytest.raises(ValueError):
        net.sshd_config_text(_config(host_key=Path('/h/"quoted"/key')))


def test_node_path_puts_node_tools_then_the_shared_venv_first() -> None:
    path = net.node_path("/run/orch-node", Path("/opt/venv/bin")).split(":")
    assert path[:2] == ["/run/orch-node/bin", "/opt/venv/bin"]
    assert path[2:] == list(net.SYSTEM_PATH)


def test_sshd_argv_in_a_namespace_mounts_the_disk_then_execs_sshd() -> None:
    argv = net.namespaced_sshd_argv(
        "l-0123456789",
        Path("/h/disk"),
        "/usr/sbin/sshd",
        Path("/h/cfg"),
        Path("/h/log"),
        Path("/h/etc"),
        "start the guard",
        "ip-10-213-0-2",
    )
    assert argv[:4] == ["ip", "netns", "exec", "orch-l-0123456789"]
    assert argv[4:9] == ["unshare", "--mount", "--uts", "--propagation", "private"]
    assert argv[-8:] == [
        "/h/disk", net.NODE_HOME, "/usr/sbin/sshd", "/h/cfg", "/h/log", "/h/etc",
        "start the guard", "ip-10-213-0-2",
    ]  # fmt: skip
    # The hostname is set first; the boot command starts detached, after the mounts and
    # before sshd.
    script = argv[11]
    assert script.index("/proc/sys/kernel/hostname") < script.index("mount")
    assert script.index("/etc/resolv.conf") < script.index('"$7"') < script.index("exec")
    assert "exec" in script and "-D" in script
    assert "/etc/hosts" in script and "/etc/resolv.conf" in script
    assert net.loopback_sshd_argv("/usr/sbin/sshd", Path("/c"), Path("/l")) == [
        "/usr/sbin/sshd", "-D", "-f", "/c", "-E", "/l",
    ]  # fmt: skip


def test_a_node_is_named_after_its_address_as_on_ec2() -> None:
    assert net.node_hostname("10.213.0.2") == "ip-10-213-0-2"


def test_a_node_hosts_file_names_itself_and_every_address_a_peer_can_have() -> None:
    subnet = IPv4Network("10.213.7.0/24")
    text = net.node_hosts_text("10.213.7.3", "ip-10-213-7-3", subnet)
    lines = text.splitlines()
    assert lines[:3] == ["127.0.0.1 localhost", "::1 localhost", "10.213.7.3 ip-10-213-7-3"]
    names = dict(line.split() for line in lines[2:])
    # every host address (the bridge's and 253 nodes'), and each in the IPv4-mapped IPv6 form
    # a dual-stack listener sees its peers in
    assert len(names) == 2 * 254
    assert names["10.213.7.2"] == names["::ffff:10.213.7.2"] == "ip-10-213-7-2"
    assert names["::ffff:10.213.7.3"] == "ip-10-213-7-3"
    assert names["10.213.7.254"] == "ip-10-213-7-254" and "10.213.7.255" not in names
    assert [line.split()[0] for line in lines].count("10.213.7.3") == 1


def test_a_large_subnet_names_its_lowest_addresses_only() -> None:
    text = net.node_hosts_text("10.8.0.2", "ip-10-8-0-2", IPv4Network("10.8.0.0/16"))
    addresses = [line.split()[0] for line in text.splitlines()[2:]]
    assert len(addresses) == 2 * net.NAMED_ADDRESSES
    assert "10.8.4.0" in addresses and "10.8.4.1" not in addresses  # the 1024 lowest
    # a node beyond them (never, while nodes take the lowest free addresses) still has its own
    assert "10.8.9.9" in net.node_hosts_text("10.8.9.9", "ip-10-8-9-9", IPv4Network("10.8.0.0/16"))


def test_host_key_line_drops_the_comment() -> None:
    assert net.host_key_line("ssh-ed25519 AAAAC3Nz l-0123456789\n") == "ssh-ed25519 AAAAC3Nz"
    with pytest.raises(ValueError):
        net.host_key_line("garbage")


def _record(iid: str, job: str = "j1", rank: int = 0) -> NodeRecord:
    return NodeRecord(
        instance_id=iid,
        job_id=job,
        cluster=f"{job}-c",
        rank=rank,
        mode="loopback",
        ip="127.0.0.1",
        port=2222,
        interface="lo",
        ssh_user="root",
        home="/h",
        host_key="ssh-ed25519 AAAA",
        market="spot",
        instance_type="local-2x",
        price_per_hour="0.25",
        launched_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).isoformat(),
        tags={"orch:job": job},
    )


def test_node_store_round_trip(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "local")
    assert store.all() == []
    for iid, rank in (("l-000000000b", 1), ("l-000000000a", 0)):
        store.create_dir(iid)
        store.save(_record(iid, rank=rank))
    assert [r.rank for r in store.all()] == [0, 1]
    inst = store.load("l-000000000a").to_instance()  # type: ignore[union-attr]
    assert inst.price_per_hour == Decimal("0.25")
    assert inst.launched_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert (inst.ssh_host, inst.private_ip, inst.market) == ("127.0.0.1", "127.0.0.1", "spot")
    assert store.load("../escape") is None
    store.remove("l-000000000a")
    assert [r.instance_id for r in store.all()] == ["l-000000000b"]


def test_provider_constructor_does_no_io(tmp_path: Path) -> None:
    home = tmp_path / "orch-home"
    provider = LocalProvider(Settings(home=home))
    assert provider.name == "local"
    assert not home.exists()
    assert provider.list_owned() == []
    assert not home.exists()


def _request(**overrides: object) -> LaunchRequest:
    fields: dict = {
        "job_id": "j1",
        "cluster": "c1",
        "count": 2,
        "gpus_per_node": 1,
        "public_key": "ssh-ed25519 AAAAC3Nz user@host",
    }
    fields.update(overrides)
    return LaunchRequest(**fields)


def test_launch_refuses_a_price_above_the_cap_before_starting_anything(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, local=LocalSettings(price_per_hour=Decimal("2")))
    with pytest.raises(CapacityError, match="above the 1.5 USD/h cap"):
        LocalProvider(settings).launch(_request(max_price_per_hour=Decimal("1.5")))
    assert not (tmp_path / "local").exists()


@pytest.mark.parametrize(
    "key", ["", "not a key", "ssh-ed25519 AAAA a\nssh-ed25519 BBBB b", "ssh-ed25519 AAAA\rx"]
)
def test_launch_refuses_anything_but_one_public_key_line(tmp_path: Path, key: str) -> None:
    with pytest.raises(ProviderError):
        LocalProvider(Settings(home=tmp_path)).launch(_request(public_key=key))
    assert not (tmp_path / "local").exists()


def test_launch_refuses_no_nodes(tmp_path: Path) -> None:
    with pytest.raises(ProviderError):
        LocalProvider(Settings(home=tmp_path)).launch(_request(count=0))


def test_network_mode_follows_the_settings_and_the_environment(tmp_path: Path) -> None:
    forced = load_settings({"ORCH_HOME": str(tmp_path), "ORCH_LOCAL_NETWORK": "loopback"})
    assert LocalProvider(forced).network_mode() == "loopback"
    auto = LocalProvider(Settings(home=tmp_path)).network_mode()
    assert auto == ("namespace" if os.geteuid() == 0 and shutil.which("ip") else "loopback")


def test_a_node_is_started_detached_with_its_output_in_the_log() -> None:
    argv = net.detached_argv(["/usr/sbin/sshd", "-D"], Path("/h/sshd.log"))
    assert argv[:2] == ["sh", "-c"]
    assert "setsid" in argv[2] and "& echo $!" in argv[2]
    assert argv[3:] == ["orch-node", "/h/sshd.log", "/usr/sbin/sshd", "-D"]


def test_an_address_given_again_is_forgotten_by_the_bridge_and_every_node() -> None:
    argvs = net.neigh_flush_argvs("10.213.0.2", "orchbr0", ["orch-l-a", "orch-l-b"])
    assert argvs == [
        ["ip", "neigh", "flush", "to", "10.213.0.2", "dev", "orchbr0"],
        ["ip", "-n", "orch-l-a", "neigh", "flush", "to", "10.213.0.2"],
        ["ip", "-n", "orch-l-b", "neigh", "flush", "to", "10.213.0.2"],
    ]
