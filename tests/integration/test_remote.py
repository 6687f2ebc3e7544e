"""The SSH layer against real sshd nodes: pinning, reuse, stdin, timeouts, rsync filters."""

from __future__ import annotations

import dataclasses
import socket
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.errors import HostKeyMismatch, NodeUnreachable, OutputTooLarge, RemoteError
from orchestrator.remote.keys import ensure_identity
from orchestrator.remote.ssh import DEFAULT_MAX_OUTPUT, NodeConnection
from orchestrator.remote.sync import Transfer, push_argv, run_parallel
from tests.support.helpers import loopback_cluster
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path_factory.mktemp("orch"), "t", count=2, gpus_per_node=1) as built:
        yield built


def test_keys_are_private(cluster: Cluster) -> None:
    key = cluster.identity.private_key
    assert key.stat().st_mode & 0o777 == 0o600
    assert key.parent.stat().st_mode & 0o777 == 0o700


def test_one_connection_serves_many_commands(cluster: Cluster) -> None:
    head = cluster.head
    first = head.run("echo $PPID").stdout
    transport = head.transport
    for _ in range(5):
        head.run("true")
    assert head.transport is transport and head.is_alive()
    # Each command is a new session of the same connection: one sshd process serves them all.
    assert head.run("echo $PPID").stdout == first


def test_stdin_reaches_the_command_and_failures_carry_the_result(cluster: Cluster) -> None:
    payload = "line 1\n'quoted' $HOME `x`\n" * 1000
    assert cluster.head.run("cat > f && cat f", stdin=payload).stdout == payload
    with pytest.raises(RemoteError) as info:
        cluster.head.run("echo boom >&2; exit 7")
    assert info.value.result.exited == 7  # type: ignore[attr-defined]
    assert "boom" in str(info.value)
    assert cluster.head.run(["printf", "%s", "a b; $c"]).stdout == "a b; $c"


def test_a_command_past_its_timeout_is_reported(cluster: Cluster) -> None:
    with pytest.raises(NodeUnreachable, match="did not finish"):
        cluster.head.run("sleep 5", timeout=0.5)


def test_a_gigabyte_of_output_is_cut_at_the_cap_in_bounded_memory_and_time(
    cluster: Cluster,
) -> None:
    """A node answering a command with 1 GiB: `run` keeps the first `DEFAULT_MAX_OUTPUT` bytes
    (16 MiB), then stops reading, ends the command and says the result was cut, long before
    its timeout. Bound: the controller's Python heap peaks below 3 x the cap (the bytes held
    twice while they are joined or decoded, and the transport's window)."""
    head = cluster.head
    head.run("true")  # connected before measuring
    tracemalloc.start()
    started = time.monotonic()
    try:
        result = head.run("head -c 1G /dev/zero; echo never-read >&2", check=False, timeout=120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - started
    assert result.cut and result.exited == -1 and not result.ok
    assert result.stdout_bytes == b"\0" * DEFAULT_MAX_OUTPUT and result.stderr == ""
    assert peak < 3 * DEFAULT_MAX_OUTPUT, f"peak {peak / 2**20:.0f} MiB"
    assert elapsed < 60, f"{elapsed:.0f} s"


def test_a_cut_command_is_ended_and_checked_runs_raise_output_too_large(cluster: Cluster) -> None:
    head = cluster.head
    marker = f"yes-{uuid.uuid4().hex[:8]}"
    with pytest.raises(OutputTooLarge, match="printed more than 1000 bytes") as info:
        head.run(f"exec -a {marker} yes", max_output=1000)
    assert isinstance(info.value, RemoteError)
    cut = info.value.result  # type: ignore[attr-defined]
    assert cut.cut and cut.stdout == "y\n" * 500
    wait_until(  # closing the channel ended it on the node
        lambda: not head.run(f"pgrep -f '[{marker[0]}]{marker[1:]}'", check=False).ok,
        "the command's end after its cut", 10, interval=0.1,
    )  # fmt: skip
    exact = head.run("head -c 1000 /dev/zero | tr '\\0' x", max_output=1000)
    assert not exact.cut and exact.ok and exact.stdout == "x" * 1000  # the cap itself fits
    assert head.run("yes | head -c 4000 >&2", check=False, max_output=1000).cut  # stderr too


def test_a_changed_host_key_is_refused(cluster: Cluster) -> None:
    other = cluster.addresses[1].host_key
    forged = dataclasses.replace(cluster.addresses[0], host_key=other)
    with pytest.raises(HostKeyMismatch, match="different host key"):
        NodeConnection(forged, cluster.identity, connect_timeout=5).run("true")


def test_a_closed_port_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from orchestrator.remote.keys import HostAddress

    identity = ensure_identity(tmp_path / "keys", "x")
    key = " ".join(identity.public_key.split()[:2])
    address = HostAddress("ghost", "127.0.0.1", port, "root", key)
    with pytest.raises(NodeUnreachable, match="cannot reach ghost"):
        NodeConnection(address, identity, connect_timeout=2).run("true")


def test_workdir_sync_honours_ignore_files_on_every_node(cluster: Cluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "code.py").write_text("x = 1\n")
    (work / ".gitignore").write_text("*.log\nbuild/\n")
    (work / ".orchignore").write_text("secret.txt\n")
    (work / "pkg" / ".gitignore").write_text("local.cfg\n")
    for name in ("run.log", "secret.txt", "pkg/local.cfg", "build/out.bin", ".git/HEAD"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("ignored")
    transfers = [
        Transfer(a.name, push_argv(work, a, cluster.identity, "synced", workdir=True))
        for a in cluster.addresses
    ]
    run_parallel(transfers)
    (work / "pkg" / "code.py").unlink()  # removed locally: removed on the nodes on the next sync
    (work / "pkg" / "new.py").write_text("y = 2\n")
    run_parallel(transfers)
    for connection in cluster.connections:
        files = connection.run("cd synced && find . -type f | sort").stdout.split()
        assert files == ["./.gitignore", "./.orchignore", "./pkg/.gitignore", "./pkg/new.py"]
    # Transfers to a node share one multiplexed ssh connection (a socket per node).
    sockets = list(cluster.identity.control_dir.iterdir())
    assert len(sockets) == len(cluster.addresses)
    assert cluster.identity.control_dir.stat().st_mode & 0o777 == 0o700


def test_the_user_s_own_ssh_config_never_applies_to_nodes(cluster: Cluster, tmp_path: Path) -> None:
    """A ~/.ssh/config meant for one's own hosts (`ForwardAgent yes`, a `LocalCommand`) must
    not reach cloud nodes through orch's rsync and ssh. ssh finds ~/.ssh in the password
    database, not in $HOME, so the config is put there in a mount namespace of the command's
    own (this machine's real home is never touched)."""
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile

    from orchestrator.remote.sync import ssh_transport_argv

    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ssh-agent") is None:
        pytest.skip("needs root, unshare and ssh-agent")
    marker = tmp_path / "local-command-ran"
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    config = home / ".ssh" / "config"
    config.write_text(
        f"Host *\n  ForwardAgent yes\n  PermitLocalCommand yes\n  LocalCommand touch {marker}\n"
    )
    config.chmod(0o600)
    real_home = pwd.getpwuid(os.getuid()).pw_dir
    in_home = [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(home), real_home,
    ]  # fmt: skip
    agent_socket = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(agent_socket)], stdout=subprocess.DEVNULL
    )
    try:
        wait_until(agent_socket.exists, "ssh-agent's socket", 10, interval=0.05)
        env = {**os.environ, "HOME": str(home), "SSH_AUTH_SOCK": str(agent_socket)}
        # the config does apply to a plain ssh in that namespace: the check below is real
        probe = subprocess.run(
            [*in_home, "ssh", "-G", "somehost"], env=env, capture_output=True, text=True
        )
        assert "permitlocalcommand yes" in probe.stdout and "forwardagent yes" in probe.stdout
        # a master of its own (a short path: a socket's name has at most 107 bytes)
        control = Path(tempfile.mkdtemp(prefix="oc", dir="/tmp"))
        identity = dataclasses.replace(cluster.identity, control_dir=control)
        address = cluster.addresses[0]
        source = tmp_path / "src"
        source.mkdir()
        (source / "a.txt").write_text("a\n")
        pushed = subprocess.run(
            [*in_home, *push_argv(source, address, identity, "from-config-test")],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        shell = ssh_transport_argv(address, identity, 10, multiplex=False)
        seen = subprocess.run(
            [*in_home, *shell, f"{address.user}@{address.host}",
             "echo agent=${SSH_AUTH_SOCK:-none}; cat from-config-test/a.txt"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == ["agent=none", "a"]  # no agent forwarded to the node
        assert not marker.exists()  # and no LocalCommand ran here
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        for master in control.iterdir() if "control" in locals() else ():
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={master}", "x"],
                           capture_output=True, timeout=10)  # fmt: skip
        if "control" in locals():
            shutil.rmtree(control, ignore_errors=True)
