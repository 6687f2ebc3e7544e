"""The fleet `orch fleet add` is given, from flags or a YAML file (`spec/fleet_file.py`)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.fleet_file import Login, fleet_from_flags, load_fleet_file, parse_login


def test_logins_parse_with_their_port_or_22() -> None:
    assert parse_login("ubuntu@10.0.0.5") == Login("ubuntu", "10.0.0.5", 22)
    assert parse_login("root@gpu-01.lab.example:2222") == Login("root", "gpu-01.lab.example", 2222)
    assert parse_login("me@[fd00::5]:2200") == Login("me", "fd00::5", 2200)
    assert str(parse_login("me@[fd00::5]")) == "me@[fd00::5]:22"


@pytest.mark.parametrize(
    "text",
    ["10.0.0.5", "@10.0.0.5", "u@", "u@host:0", "u@host:99999", "u@host:x", "u@-bad",
     "u@ho st", "u;rm@host", "u@[nothex]", "u@[::1]x", "u@host;id"],
)  # fmt: skip
def test_bad_logins_say_why(text: str) -> None:
    with pytest.raises(ValueError):
        parse_login(text)


def test_flags_make_a_fleet_with_absolute_paths_and_a_host_price(tmp_path: Path) -> None:
    fleet = fleet_from_flags(
        {"name": "lab", "hosts": ["u@a", "u@b:2222"], "identity": "key",
         "price_per_hour": "2.40", "known_hosts": None},
        tmp_path,
    )  # fmt: skip
    assert fleet.hosts == ["u@a:22", "u@b:2222"]
    assert fleet.identity == tmp_path / "key" and fleet.known_hosts is None
    assert fleet.price == (Decimal("2.40"), "host")
    free = fleet_from_flags({"name": "lab", "hosts": ["u@a"], "identity": "/k"}, tmp_path)
    assert free.price == (Decimal(0), "host")


def test_every_bad_field_is_named_in_one_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        fleet_from_flags(
            {"name": "Bad Name", "hosts": ["u@a", "u@a:22"], "identity": "/k",
             "price_per_hour": "-1", "proxy_jump": "nobody"},
            tmp_path,
        )  # fmt: skip
    text = str(caught.value)
    for field in ("name:", "hosts:", "price_per_hour:", "proxy_jump:"):
        assert field in text
    assert "given twice" in text
    with pytest.raises(SpecError, match="not both"):
        fleet_from_flags(
            {"name": "x", "hosts": ["u@a"], "identity": "/k", "price_per_hour": "1",
             "price_per_gpu_hour": "1"},
            tmp_path,
        )  # fmt: skip
    with pytest.raises(SpecError, match="hosts"):
        fleet_from_flags({"name": "x", "identity": "/k"}, tmp_path)


def test_a_fleet_file_reads_the_same_fields(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "fleet.yaml"
    path.parent.mkdir()
    path.write_text(
        "name: lab\nhosts: [root@10.0.0.5, root@10.0.0.6:2222]\nidentity: keys/id\n"
        "known_hosts: /etc/ssh/ssh_known_hosts\nproxy_jump: me@bastion\n"
        "price_per_gpu_hour: 1.10\n"
    )
    fleet = load_fleet_file(path, None)
    assert fleet.identity == path.parent / "keys" / "id"  # relative to the file
    assert fleet.known_hosts == Path("/etc/ssh/ssh_known_hosts")
    assert fleet.proxy_jump == "me@bastion:22" and fleet.price == (Decimal("1.10"), "gpu")
    assert load_fleet_file(path, "lab").name == "lab"
    with pytest.raises(SpecError, match="names the fleet 'lab', the command 'other'"):
        load_fleet_file(path, "other")


def test_a_bad_fleet_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("hosts: [root@a]\nidentity: /k\nsurprise: 1\n")
    with pytest.raises(SpecError) as caught:
        load_fleet_file(path, None)
    assert "name:" in str(caught.value) and "surprise:" in str(caught.value)
    path.write_text("- a list\n")
    with pytest.raises(SpecError, match="mapping"):
        load_fleet_file(path, "x")
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not YAML"):
        load_fleet_file(path, None)
    with pytest.raises(SpecError, match="cannot read"):
        load_fleet_file(tmp_path / "absent.yaml", None)
