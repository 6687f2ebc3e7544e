"""Two allocations on ONE real sshd node, as two jobs on a machine the user already has: each
node has its own home there (`Instance.home`), and everything orch does for it (commands,
rsync both ways, local data) stays in it; `allocation-end` ends one without touching the
other, the machine's own files or its sshd."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.data_fanout import copy_between_nodes, node_to_node, send_local_data
from orchestrator.errors import RemoteError
from orchestrator.node import runtime
from orchestrator.node.allocation_end import allocation_end_command
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import pull_file_argv, push_argv, run_rsync
from tests.support.helpers import loopback_cluster

IDS = ("s-aaaaaaaaaaaa", "s-bbbbbbbbbbbb")


@dataclasses.dataclass
class Machine:
    """One node of the local provider, seen as a user's machine: its login (no home of its
    own) and two allocations on it."""

    login: NodeConnection
    login_home: str
    allocations: list[Cluster]

    def home(self, i: int) -> str:
        return f"{self.login_home}/.orch-fleet/{IDS[i]}"


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    with loopback_cluster(tmp_path_factory.mktemp("orch"), "machine", count=1) as whole:
        login = whole.head
        login_home = login.run('printf %s "$HOME"').stdout
        node = whole.instances[0]
        allocations = [
            Cluster(
                [dataclasses.replace(node, instance_id=i, home=f"{login_home}/.orch-fleet/{i}")],
                whole.identity,
                connect_timeout=5,
            )
            for i in IDS
        ]
        try:
            yield Machine(login, login_home, allocations)
        finally:
            for allocation in allocations:
                allocation.close()


def test_each_allocation_sees_only_its_own_files_and_home(machine: Machine, tmp_path: Path) -> None:
    for i, allocation in enumerate(machine.allocations):
        workdir = tmp_path / f"w{i}"
        workdir.mkdir()
        (workdir / f"only-{i}.txt").write_text(f"job {i}\n")
        address = allocation.addresses[0]
        argv = push_argv(workdir, address, allocation.identity, "orch-jobs/j/workdir", workdir=True)
        run_rsync(argv, what=f"push {i}")
        run_rsync(push_argv(workdir, address, allocation.identity, "~/data"), what=f"data {i}")
    for i, allocation in enumerate(machine.allocations):
        said = allocation.head.run(
            'echo "$HOME"; pwd; ls orch-jobs/j/workdir; ls ~/data; cat ~/orch-jobs/j/workdir/*'
        ).stdout.split()
        home = machine.home(i)
        assert said == [home, home, f"only-{i}.txt", f"only-{i}.txt", "job", str(i)]
        back = tmp_path / f"back-{i}.txt"
        address = allocation.addresses[0]
        argv = pull_file_argv(address, allocation.identity, f"data/only-{i}.txt", back)
        run_rsync(argv, what=f"pull {i}")
        assert back.read_text() == f"job {i}\n"
        assert allocation.head.run("stat -c %a .").stdout.strip() == "700"
    # nothing of either landed in the machine's own home
    assert not {"orch-jobs", "data"} & set(machine.login.run("ls -A").stdout.split())


def test_local_data_goes_to_each_allocation_straight_from_this_machine(
    machine: Machine, tmp_path: Path
) -> None:
    """Two allocations of one job (ranks 0 and 1, each on its own home here): no node-to-node
    copy (the nodes have no login of their own), each gets the data from this machine."""
    nodes = [a.instances[0] for a in machine.allocations]
    job = Cluster(
        [dataclasses.replace(n, rank=r) for r, n in enumerate(nodes)],
        machine.allocations[0].identity,
        connect_timeout=5,
    )
    try:
        assert not node_to_node(job)
        source = tmp_path / "ds"
        source.mkdir()
        (source / "shard").write_bytes(b"x" * 100_000)
        result = send_local_data(job, [(source, "~/ds")])
        assert result.uplink.bytes == 200_000 and result.fanout.bytes == 0
        for i, connection in enumerate(job.connections):
            assert connection.run("wc -c < ds/shard; echo $HOME").stdout.split() == [
                "100000",
                machine.home(i),
            ]
        with pytest.raises(RemoteError, match="do not copy to each other"):
            copy_between_nodes(job, ["ds"], 0, [1])
    finally:
        job.close()


def sleeper(connection: NodeConnection) -> list[int]:
    """Two detached processes of the allocation (a shell loop and a long sleep): their pids."""
    return [
        int(connection.run(f"setsid nohup {cmd} > /dev/null 2>&1 < /dev/null & echo $!").stdout)
        for cmd in ("bash -c 'while true; do sleep 0.2; done'", "sleep 600")
    ]


def alive(connection: NodeConnection, pids: list[int]) -> list[bool]:
    """Whether each process runs (a zombie, ended but not reaped yet, does not)."""
    said = connection.run(
        " ".join(f'echo "$(sed "s/.*) //" /proc/{p}/stat 2>/dev/null | cut -c1)-";' for p in pids)
    )
    return [word not in ("-", "Z-") for word in said.stdout.split()]


def test_ending_one_allocation_leaves_the_other_and_the_machine(machine: Machine) -> None:
    login = machine.login
    login.run(runtime.install_command(), stdin=runtime.install_input())
    program = f"{machine.login_home}/{runtime.node_path()}"
    keys = f"{machine.login_home}/.ssh/authorized_keys"
    lines = [
        f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA{c} orch-allocation:{i}\n"
        for c, i in zip("AB", IDS, strict=True)
    ]
    # the user's own line (no newline at its end), the two allocations' and one after them
    own = 'from="10.0.0.0/8" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAU me@laptop\r'
    tail = "ssh-rsa AAAAB3NzaC1yc2EAAAAT orch-allocation:s-aaaaaaaaaaaa0\n"  # a longer id
    login.run(f"mkdir -p .ssh && cat > {keys}", stdin=own + "\n" + "".join(lines) + tail)
    before = login.run(f"cat {keys}").stdout_bytes
    a, b = machine.allocations
    for allocation in (a, b):
        allocation.head.run("mkdir -p ckpt && echo kept > ckpt/f")
    pids_a, pids_b = sleeper(a.head), sleeper(b.head)
    assert alive(login, pids_a + pids_b) == [True] * 4

    said = login.run(allocation_end_command(program, machine.home(0), f"orch-allocation:{IDS[0]}"))
    report = json.loads(said.stdout)
    assert report["processes"] >= 2 and report["keys"] == 1 and report["errors"] == []

    assert alive(login, pids_a) == [False, False] and alive(login, pids_b) == [True, True]
    assert login.run(f"test -e {machine.home(0)} && echo there || echo gone").stdout == "gone\n"
    assert b.head.run("cat ckpt/f").stdout == "kept\n"
    after = login.run(f"cat {keys}").stdout_bytes
    assert after == before.replace(lines[0].encode(), b"")  # the others byte for byte
    assert login.run(f"test -f {program} && echo kept").stdout == "kept\n"  # the machine's
    fresh = NodeConnection(a.addresses[0], a.identity, connect_timeout=5)  # sshd answers
    try:
        assert fresh.run("echo $HOME").stdout.strip() == machine.home(0)  # a new home, empty
    finally:
        fresh.close()
    # run again: nothing left of it, nothing else touched; then the other one ends too
    again = json.loads(
        login.run(
            allocation_end_command(program, machine.home(0), f"orch-allocation:{IDS[0]}")
        ).stdout
    )
    assert (again["processes"], again["keys"]) == (0, 0)
    assert alive(login, pids_b) == [True, True]
    login.run(allocation_end_command(program, machine.home(1), f"orch-allocation:{IDS[1]}"))
    assert alive(login, pids_b) == [False, False]
    both = "".join(lines).encode()
    assert login.run(f"cat {keys}").stdout_bytes == before.replace(both, b"")
