"""A node that is an allocation on a shared machine, as built before any node: the shell text
that puts a command in the node's home (run by a real shell), rsync's `--rsync-path`, and the
jump host in the ssh argv (read back by the real OpenSSH client, `ssh -G`)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.node_home import (
    NO_HOME_EXIT,
    in_home,
    jump_command,
    jump_options,
    rsync_path,
)
from orchestrator.remote.shell import shell_argv, ssh_config_block
from orchestrator.remote.sync import pull_argv, pull_file_argv, push_argv, ssh_transport_argv

NODE = HostAddress("node 0 (s-0123456789ab)", "10.77.0.3", 22, "lab", "ssh-ed25519 AAAA")
HOME = "/home/lab/.orch-fleet/s-0123456789ab"


def identity(root: Path) -> Identity:
    return Identity(root / "id_ed25519", "ssh-ed25519 BBBB", root / "known_hosts", root / "ctl")


def sh(text: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", text], cwd=cwd, capture_output=True, text=True, env={"HOME": str(cwd)}
    )


def test_a_command_in_a_node_home_runs_there_with_home_set_and_the_folder_made_private(
    tmp_path: Path,
) -> None:
    home = tmp_path / "login" / ".orch-fleet" / "s-1 it's"
    done = sh(in_home('echo "$HOME"; pwd; echo ~; umask; exit 7', str(home)), tmp_path)
    assert done.returncode == 7, done.stderr  # the command's own exit status
    assert done.stdout.split("\n")[:3] == [str(home)] * 3
    assert done.stdout.split("\n")[3] != "0077"  # the command keeps the login's umask
    assert home.stat().st_mode & 0o777 == 0o700 and (home.parent.stat().st_mode & 0o777) == 0o700
    assert sh(in_home("echo hi", None), tmp_path).stdout == "hi\n"  # no home: as it was


def test_a_node_home_that_cannot_be_made_fails_before_the_command(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = sh(in_home("echo ran", str(tmp_path / "file" / "home")), tmp_path)
    assert done.returncode == NO_HOME_EXIT and "ran" not in done.stdout
    assert "cannot make or enter the node home" in done.stderr


@pytest.mark.parametrize("home", ["relative/x", "/a\nb", ""])
def test_a_home_that_is_not_one_absolute_line_is_refused(home: str) -> None:
    with pytest.raises(ConfigError):
        in_home("true", home)


def test_rsync_runs_in_the_node_home_keeping_the_low_priority_variant(tmp_path: Path) -> None:
    node = dataclasses.replace(NODE, home=HOME)
    push = push_argv(tmp_path, node, identity(tmp_path), "orch-jobs/j/workdir", workdir=True)
    value = f"export HOME={HOME} && (umask 077 && mkdir -p -- {HOME}) && cd -- {HOME} && rsync"
    assert f"--rsync-path={value}" in push
    low = push_argv(tmp_path, node, identity(tmp_path), "~/ds", low_priority=True)
    assert [a for a in low if a.startswith("--rsync-path=")] == [
        f"--rsync-path={value[: -len('rsync')]}nice -n 10 rsync"
    ]
    assert low[-1] == "lab@10.77.0.3:ds/"  # `~/` is the node's home: rsync's relative path
    for argv in (
        pull_argv(node, identity(tmp_path), "orch-jobs/j/run", tmp_path),
        pull_file_argv(node, identity(tmp_path), "orch-jobs/j/run/node.log", tmp_path / "f"),
    ):
        assert f"--rsync-path={value}" in argv
    # a node that is the whole machine: rsync's own default, as before
    assert not any(
        a.startswith("--rsync-path") for a in push_argv(tmp_path, NODE, identity(tmp_path), "x")
    )
    assert rsync_path(None, nice=10) == "nice -n 10 rsync"


def test_the_rsync_path_runs_in_a_real_shell_as_rsync_would_start_it(tmp_path: Path) -> None:
    home = tmp_path / "login" / ".orch-fleet" / "s-0123456789ab"
    value = rsync_path(str(home))
    assert value is not None
    done = sh(value.replace("&& rsync", '&& echo "$HOME" && pwd'), tmp_path)
    assert done.stdout.split() == [str(home), str(home)]


def ssh_g(argv: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["ssh", "-G", *argv[1:]], capture_output=True, text=True, check=True,
        stdin=subprocess.DEVNULL,
    ).stdout  # fmt: skip
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_a_node_behind_a_jump_host_is_reached_through_it(tmp_path: Path) -> None:
    node = dataclasses.replace(NODE, proxy_jump="admin@gw.example.org:2200")
    transport = ssh_transport_argv(node, identity(tmp_path), 10, multiplex=False)
    assert ssh_g([*transport, node.host])["proxyjump"] == "admin@gw.example.org:2200"
    person = shell_argv(node, identity(tmp_path), tmp_path / "kh")
    assert ssh_g(person)["proxyjump"] == "admin@gw.example.org:2200"
    assert "  ProxyJump admin@gw.example.org:2200" in ssh_config_block(
        "a", node, identity(tmp_path), tmp_path / "kh"
    )
    assert jump_options("u@10.0.0.1") == ["-J", "u@10.0.0.1:22"]
    assert jump_options(None) == [] and "-J" not in ssh_transport_argv(NODE, identity(tmp_path), 10)
    # paramiko's side: the same jump as `ssh -J` makes it, in batch mode
    assert jump_command("u@[fd00::1]:2", 5).split() == [
        "ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ForwardAgent=no",
        "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes", "-o", "ConnectTimeout=5",
        "-l", "u", "-p", "2", "-W", "'[%h]:%p'", "fd00::1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "jump", ["gw.example.org", "-oProxyCommand=x@y", "u@h:0", "u@h;reboot", "u@h:99999", "@h"]
)
def test_a_jump_host_that_is_not_user_at_address_is_refused(jump: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="USER@ADDR"):
        ssh_transport_argv(dataclasses.replace(NODE, proxy_jump=jump), identity(tmp_path), 10)


def test_orch_ssh_to_a_node_home_lands_in_it(tmp_path: Path) -> None:
    node = dataclasses.replace(NODE, home=HOME)
    shell = shell_argv(node, identity(tmp_path), tmp_path / "kh")
    assert "-t" in shell and shell[-2] == "--"
    assert shell[-1] == in_home('exec "${SHELL:-/bin/sh}" -l', HOME)
    command = shell_argv(node, identity(tmp_path), tmp_path / "kh", command=["ls", "a b"])
    assert command[-1] == in_home("ls 'a b'", HOME) and "-t" not in command
