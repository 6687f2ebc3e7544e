"""Copies between nodes: the one-time key's grant, arming and removal (the shell text run
by a real `sh` against a throw-away HOME), the home a node reports, and the sender's argv."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import RemoteError
from orchestrator.remote import node_copy
from orchestrator.remote.keys import HostAddress

RECEIVER = HostAddress("node 1 (l-1)", "10.213.0.3", 22, "root", "ssh-ed25519 AAAAhostkey")


def sh(home: Path, script: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run(
        ["sh", "-c", script], input=stdin, env=env, capture_output=True, text=True, check=True
    )


def test_a_grant_appends_one_marked_line_and_its_revocation_removes_only_it(
    tmp_path: Path,
) -> None:
    key = node_copy.one_time_key()
    other = node_copy.one_time_key()
    keys = tmp_path / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_text("ssh-ed25519 AAAAmine me@laptop")  # no newline at its end
    inode = keys.stat().st_ino
    sh(tmp_path, node_copy.authorize_script(key))
    sh(tmp_path, node_copy.authorize_script(other))
    assert keys.read_text().splitlines() == [
        "ssh-ed25519 AAAAmine me@laptop",
        f"restrict {key.public_line}",
        f"restrict {other.public_line}",
    ]
    sh(tmp_path, node_copy.revoke_script(key.token))
    assert keys.read_text() == f"ssh-ed25519 AAAAmine me@laptop\nrestrict {other.public_line}\n"
    assert keys.stat().st_ino == inode
    sh(tmp_path, node_copy.revoke_script(key.token))  # again: nothing to do
    sh(tmp_path, node_copy.revoke_script(other.token))
    assert keys.read_text() == "ssh-ed25519 AAAAmine me@laptop\n"
    assert list(keys.parent.iterdir()) == [keys]


def test_a_grant_makes_a_private_ssh_folder_and_a_revocation_leaves_nothing_odd(
    tmp_path: Path,
) -> None:
    key = node_copy.one_time_key()
    sh(tmp_path, node_copy.revoke_script(key.token))  # no file yet: nothing
    assert not (tmp_path / ".ssh").exists()
    sh(tmp_path, node_copy.authorize_script(key))
    keys = tmp_path / ".ssh" / "authorized_keys"
    assert keys.read_text() == f"restrict {key.public_line}\n"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.parent.stat().st_mode) == 0o700
    sh(tmp_path, node_copy.revoke_script(key.token))
    assert keys.read_text() == ""


def test_arming_a_sender_writes_the_key_0600_and_the_pins_and_disarming_removes_them(
    tmp_path: Path,
) -> None:
    key = node_copy.one_time_key()
    said = sh(tmp_path, node_copy.arm_script(key, [RECEIVER]), stdin=key.private_pem)
    assert said.stdout == str(tmp_path)
    folder = tmp_path / key.key_dir
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert (folder / "id").read_text() == key.private_pem
    assert stat.S_IMODE((folder / "id").stat().st_mode) == 0o600
    assert (folder / "known_hosts").read_text() == "10.213.0.3 ssh-ed25519 AAAAhostkey\n"
    sh(tmp_path, node_copy.disarm_script(key.token))
    assert not folder.exists()


def test_the_key_is_fresh_each_time_and_never_on_a_command_line() -> None:
    one, two = node_copy.one_time_key(), node_copy.one_time_key()
    assert one.token != two.token and one.private_pem != two.private_pem
    assert one.public_line.startswith("ssh-ed25519 ")
    assert one.public_line.endswith(f" orch-fanout-{one.token}")
    assert "PRIVATE" not in node_copy.arm_script(one, [RECEIVER])


@pytest.mark.parametrize("token", ["", "../../etc", "0123456789abcdeg", "*"])
def test_a_token_that_is_not_one_is_refused(token: str) -> None:
    with pytest.raises(ValueError):
        node_copy.revoke_script(token)
    with pytest.raises(ValueError):
        node_copy.disarm_script(token)


def test_a_node_s_home_is_checked_before_it_goes_into_ssh_options() -> None:
    assert node_copy.node_home("/run/orch-node") == "/run/orch-node"
    assert node_copy.node_home("/home/ubuntu/") == "/home/ubuntu"
    assert node_copy.node_home("/") == "/"
    for bad in ["", "relative", '/a"b', "/a'b", "/a\\b", "/a\nb", "/a${X}", "/" + "a" * 1100]:
        with pytest.raises(RemoteError):
            node_copy.node_home(bad)


def test_a_sender_copies_a_path_into_its_parent_on_the_receiver() -> None:
    key = node_copy.one_time_key()
    transport = node_copy.node_transport("/home/ubuntu", key, 10)
    argv = node_copy.node_copy_argv("~/data/", RECEIVER, transport)
    assert argv[0] == "rsync" and argv[-2:] == ["data", "root@10.213.0.3:./"]
    assert "--partial-dir=.orch-partial" in argv and "--mkpath" in argv
    ssh = shlex.split(argv[argv.index("-e") + 1])
    assert ssh[-2:] == ["-p", "22"]
    assert f'IdentityFile="/home/ubuntu/{key.key_dir}/id"' in ssh  # ssh strips the quotes
    assert f'UserKnownHostsFile="/home/ubuntu/{key.key_dir}/known_hosts"' in ssh
    assert "StrictHostKeyChecking=yes" in ssh and "ForwardAgent=no" in ssh
    absolute = node_copy.node_copy_argv("/mnt/ds/.m.json", RECEIVER, transport)
    assert absolute[-2:] == ["/mnt/ds/.m.json", "root@10.213.0.3:/mnt/ds/"]
    top = node_copy.node_copy_argv("/ds", RECEIVER, transport)
    assert top[-2:] == ["/ds", "root@10.213.0.3:/"]


def test_a_sender_s_copy_is_bounded_in_time_and_may_give_way() -> None:
    v6 = HostAddress("node 2", "fd00::5", 2222, "ubuntu", "ssh-ed25519 AAAA")
    transport = node_copy.node_transport("/home/ubuntu", node_copy.one_time_key(), 10)
    argv = node_copy.node_copy_argv("ds", v6, transport, timeout_s=90, low_priority=True)
    assert argv[:8] == ["timeout", "-k", "5", "90", "nice", "-n", "10", "rsync"]
    assert "--rsync-path=nice -n 10 rsync" in argv
    assert argv[-1] == "ubuntu@[fd00::5]:./"
    assert shlex.split(argv[argv.index("-e") + 1])[-2:] == ["-p", "2222"]


@pytest.mark.parametrize("path", ["~", "~/", ".", "/", "~/."])
def test_a_home_or_root_is_not_something_to_copy(path: str) -> None:
    transport = node_copy.node_transport("/root", node_copy.one_time_key(), 10)
    with pytest.raises(ValueError):
        node_copy.node_copy_argv(path, RECEIVER, transport)
