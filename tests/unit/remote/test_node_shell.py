"""`orch ssh` and `orch ssh-config` as built, before any node: the ssh argv (pinning, refusals,
forwardings, a command's arguments kept whole) and the `Host` block, read back by the real
OpenSSH client (`ssh -G` resolves a configuration without connecting)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.shell import Forward, parse_forward, shell_argv, ssh_config_block

NODE = HostAddress("node 1 (l-0123456789)", "10.77.0.3", 2222, "root", "ssh-ed25519 AAAA")


def identity(root: Path) -> Identity:
    return Identity(root / "id_ed25519", "ssh-ed25519 BBBB", root / "known_hosts", root / "ctl")


def options(argv: list[str]) -> dict[str, str]:
    """The `-o Key=value` options of an argv, by key."""
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-o")


def resolved(argv: list[str]) -> dict[str, str]:
    """What OpenSSH makes of an ssh argv or config (`ssh -G`: resolve, print, connect to
    nothing), lower-case keys as it prints them."""
    out = subprocess.run(
        ["ssh", "-G", *argv], capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


@pytest.mark.parametrize(
    ("text", "forward"),
    [
        ("6006:localhost:6006", Forward(6006, "localhost", 6006)),
        ("8080:10.77.0.2:80", Forward(8080, "10.77.0.2", 80)),
        ("0.0.0.0:9000:localhost:9001", Forward(9000, "localhost", 9001, "0.0.0.0")),
    ],
)
def test_a_forwarding_is_read_as_ssh_takes_it(text: str, forward: Forward) -> None:
    assert parse_forward(text) == forward


@pytest.mark.parametrize(
    "text", ["6006", "6006:localhost", "x:localhost:1", "0:h:80", "80:h:70000"]
)
def test_a_bad_forwarding_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_forward(text)
    assert refused.value.exit_code == 2 and f"-L {text!r}" in refused.value.message


def test_the_ssh_reads_no_config_uses_only_the_cluster_key_and_forwards_nothing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch home"  # a blank in the path, as ORCH_HOME may have
    argv = shell_argv(NODE, identity(home), home / "known_hosts.shell")
    assert argv[:3] == ["ssh", "-F", "/dev/null"]
    seen = resolved(argv[1:])
    assert seen["hostname"] == "10.77.0.3" and seen["port"] == "2222" and seen["user"] == "root"
    assert seen["identityfile"] == str(home / "id_ed25519")
    assert seen["userknownhostsfile"] == str(home / "known_hosts.shell")
    assert seen["stricthostkeychecking"] == "true" and seen["identitiesonly"] == "yes"
    assert seen["forwardagent"] == "no" and seen["forwardx11"] == "no"
    assert seen["clearallforwardings"] == "yes"  # no forwarding from anywhere


def test_forwardings_are_exactly_those_asked_for_and_must_bind(tmp_path: Path) -> None:
    forwards = [Forward(6006, "localhost", 6006), Forward(8888, "localhost", 8888)]
    argv = shell_argv(NODE, identity(tmp_path), tmp_path / "kh", forwards=forwards)
    opts = options(argv)
    assert "ClearAllForwardings" not in opts  # it would clear these too
    assert opts["ExitOnForwardFailure"] == "yes"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-L"] == [
        "127.0.0.1:6006:localhost:6006",
        "127.0.0.1:8888:localhost:8888",
    ]


def test_a_command_reaches_the_node_s_shell_with_its_arguments_whole(tmp_path: Path) -> None:
    command = ["python3", "-c", "import sys; print(sys.argv)", "a b", "$HOME", "it's"]
    argv = shell_argv(NODE, identity(tmp_path), tmp_path / "kh", command=command)
    assert argv[-3:-1] == ["10.77.0.3", "--"]
    assert shlex.split(argv[-1]) == command  # what the node's shell will split it into


def test_the_host_block_resolves_in_openssh_to_the_pinned_key_and_no_forwarding(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch home"  # a blank in the path, as ORCH_HOME may have
    block = ssh_config_block("orch-demo-1", NODE, identity(home), home / "known_hosts.shell")
    config = tmp_path / "config"
    config.write_text(block)
    seen = resolved(["-F", str(config), "orch-demo-1"])
    assert seen["hostname"] == "10.77.0.3" and seen["port"] == "2222" and seen["user"] == "root"
    assert seen["identityfile"] == str(home / "id_ed25519")
    assert seen["userknownhostsfile"] == str(home / "known_hosts.shell")
    assert seen["stricthostkeychecking"] == "true" and seen["identitiesonly"] == "yes"
    assert seen["forwardagent"] == "no" and seen["permitlocalcommand"] == "no"


def test_a_value_ssh_config_cannot_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError):
        ssh_config_block("orch-x-0", NODE, identity(tmp_path / 'a"b'), tmp_path / "kh")
