"""Machines a test starts as a user's own: the hosts of an SSH fleet.

Each machine is a real sshd in a network namespace of its own with its own address on a bridge
of its set (10.215.N.0/24, a subnet no other test uses; N is picked per set, so sets of tests
running beside each other never meet). It is built with the local provider's public kit, as the
sandbox builds its hosts, and looks to orch like a machine it did not start:

- its login is `root@<address>:22`, with a login home of its own (`home`, sshd's `SetEnv HOME`;
  the machine's /etc/passwd, bind-mounted in a private mount namespace, names the same home, so
  nothing that looks the home up in passwd ever reaches this machine's real /root);
- the user's public key is in `<home>/.ssh/authorized_keys` (the only keys file sshd reads
  besides none: a line added there is a key that logs in, a line removed one that does not);
- the shared venv's `bin` is on its PATH (python3 with torch), after `<home>/bin`;
- with `gpus=N > 0`, an `nvidia-smi` stand-in (`tests/fixtures/nvidia_smi_replay.py`) in
  `<home>/bin` replays N idle H200s; with `gpus=0` there is no nvidia-smi at all (a CPU host).

`kill()` ends a machine at once, like a power cut: its link goes down (its address stops
answering) and every process of it, sshd included, is killed. At the end of
`fleet_machines` every machine is ended and its namespace, veth and the set's bridge removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from pathlib import Path

import psutil

from orchestrator.providers.local import kit
from orchestrator.sandbox.hosts import SFTP_SERVERS

SUPERNET = "10.215"  # fleets' machines: 10.215.N.0/24, N in 1..254 (see `_bridge`)
MARKER = "ORCH_FLEET_MACHINE"  # environment variable carried by every process of a machine
REPLAY = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_smi_replay.py"
GPU_MEMORY_MIB = 143771  # what the stand-in reports as each GPU's memory.total
READY_TIMEOUT_S = 20.0


@dataclass
class FleetMachine:
    """One started machine. `login` is what `orch fleet add --host` takes."""

    name: str  # its network namespace, and the marker its processes carry
    address: str
    home: Path  # its login home, a folder of this machine
    key: Path  # the user's private key (shared by the machines of a set)
    directory: Path  # its own files: host key, sshd_config, sshd.log, etc/
    gpus: int
    veth: str
    bridge: str
    port: int = 22
    sshd_pid: int = 0
    killed: bool = field(default=False)

    @property
    def login(self) -> str:
        return f"root@{self.address}:{self.port}"

    @property
    def host_key(self) -> str:
        """Its host key as `ssh-ed25519 AAAA...` (a known_hosts line's key part)."""
        return kit_host_key((self.directory / "ssh_host_ed25519_key.pub").read_text())

    def known_hosts_line(self) -> str:
        return f"{self.address} {self.host_key}\n"

    def kill(self) -> None:
        """End the machine at once: link down first, then SIGKILL every process of it."""
        self.killed = True
        subprocess.run(["ip", "link", "set", "dev", self.veth, "down"], capture_output=True)
        # forget its link-layer address, as peers do once a dead machine stops answering ARP:
        # a new connection then fails with "no route to host" within seconds
        flush = ["ip", "neigh", "flush", "to", self.address, "dev", self.bridge]
        subprocess.run(flush, capture_output=True)
        if not kit.sweep(self._pids):
            raise AssertionError(f"processes of machine {self.name} survive SIGKILL")

    def sshd_alive(self) -> bool:
        """Whether its sshd (the process the machine started with) runs and answers."""
        try:
            process = psutil.Process(self.sshd_pid)
            running = process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
        return running and kit.answers_ssh(self.address, self.port)

    def _pids(self) -> set[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        pids = {int(tok) for tok in out.stdout.split() if tok.isdigit()}
        return pids | kit.pids_with_env(MARKER, self.name)


def kit_host_key(pub_text: str) -> str:
    fields = pub_text.split()
    return f"{fields[0]} {fields[1]}"


@contextlib.contextmanager
def fleet_machines(tmp_path: Path, gpus: Sequence[int] = (2, 2)) -> Iterator[list[FleetMachine]]:
    """Start one machine per item of `gpus` (its GPU count; 0: a CPU host), all answering SSH
    when this yields; every one ended and its network removed at exit."""
    root = tmp_path / "fleet-machines"
    root.mkdir(parents=True, exist_ok=True)
    key = root / "id_ed25519"
    if not key.exists():
        kit.run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    n, bridge = _bridge()
    subnet = IPv4Network(f"{SUPERNET}.{n}.0/24")
    machines: list[FleetMachine] = []
    try:
        for i, count in enumerate(gpus):
            machines.append(_start(root, key, n, i, count, subnet, bridge))
        for machine in machines:
            _wait_ready(machine)
        yield machines
    finally:
        for machine in machines:
            _end(machine)
        subprocess.run(["ip", "link", "del", "dev", bridge], capture_output=True)


def _bridge() -> tuple[int, str]:
    """A free subnet number N and its bridge (made here, holding 10.215.N.1/24).

    The bridge's name carries N, so creating it claims N atomically among concurrent sets."""
    for n in random.sample(range(1, 255), 254):
        bridge = f"oflbr{n}"
        made = subprocess.run(
            ["ip", "link", "add", "name", bridge, "type", "bridge"], capture_output=True
        )
        if made.returncode != 0:
            continue  # another set holds N
        kit.run_checked(["ip", "addr", "add", f"{SUPERNET}.{n}.1/24", "dev", bridge])
        kit.run_checked(["ip", "link", "set", "dev", bridge, "up"])
        return n, bridge
    raise AssertionError("no free 10.215.N.0/24 subnet for fleet machines")


def _start(
    root: Path, key: Path, n: int, i: int, gpus: int, subnet: IPv4Network, bridge: str
) -> FleetMachine:
    name, veth, address = f"ofl-{n}-{i}", f"ofl{n}x{i}", f"{SUPERNET}.{n}.{10 + i}"
    directory = root / f"m{i}"
    home = directory / "home"
    machine = FleetMachine(name, address, home, key, directory, gpus, veth, bridge)
    _prepare_files(machine, subnet)
    for argv in (
        ["ip", "netns", "add", name],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name],
        ["ip", "link", "set", "dev", veth, "master", bridge],
        ["ip", "link", "set", "dev", veth, "up"],
        ["ip", "-n", name, "addr", "add", f"{address}/24", "dev", "eth0"],
        ["ip", "-n", name, "link", "set", "dev", "lo", "up"],
        ["ip", "-n", name, "link", "set", "dev", "eth0", "up"],
        ["ip", "-n", name, "route", "add", "default", "via", f"{SUPERNET}.{n}.1"],
    ):
        kit.run_checked(argv)
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    script = (
        'mount --bind "$1/passwd" /etc/passwd && mount --bind "$1/hosts" /etc/hosts && '
        'mount --bind "$1/resolv.conf" /etc/resolv.conf || exit 1\n'
        'exec "$2" -D -f "$3" -E "$4"'
    )
    argv = [
        "ip", "netns", "exec", name, "unshare", "--mount", "--propagation", "private",
        "sh", "-c", script, "fleet-machine", str(directory / "etc"), _sshd(),
        str(directory / "sshd_config"), str(directory / "sshd.log"),
    ]  # fmt: skip
    env = {"PATH": ":".join(kit.SYSTEM_PATH), MARKER: name}
    out = subprocess.run(
        kit.detached_argv(argv, directory / "sshd.log"),
        env=env, cwd="/", capture_output=True, text=True, check=True,
    )  # fmt: skip
    machine.sshd_pid = int(out.stdout.split()[0])
    return machine


def _prepare_files(machine: FleetMachine, subnet: IPv4Network) -> None:
    directory, home = machine.directory, machine.home
    (home / ".ssh").mkdir(mode=0o700, parents=True)
    directory.chmod(0o700)
    host_key = directory / "ssh_host_ed25519_key"
    kit.run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)])
    public = machine.key.with_suffix(".pub").read_text().strip()
    (home / ".ssh" / "authorized_keys").write_text(public + "\n")
    bin_dir = home / "bin"
    bin_dir.mkdir()
    if machine.gpus > 0:
        smi = bin_dir / "nvidia-smi"
        shutil.copyfile(REPLAY, smi)
        smi.chmod(0o755)
        trace = {"mode": "normal", "gpus": [[0, 0, GPU_MEMORY_MIB]] * machine.gpus}
        (bin_dir / "nvidia-smi.trace").write_text(json.dumps(trace))
    etc = directory / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(_passwd(Path("/etc/passwd").read_text(), str(home)))
    hosts = kit.node_hosts_text(machine.address, os.uname().nodename, subnet)
    (etc / "hosts").write_text(hosts)
    (etc / "resolv.conf").write_text(kit.NODE_RESOLV_CONF)
    env = {
        "HOME": str(home),
        "PATH": kit.node_path(str(home), Path(sys.prefix) / "bin"),
        MARKER: machine.name,
    }
    config = kit.SshdConfig(
        listen=f"0.0.0.0:{machine.port}",
        host_key=host_key,
        authorized_keys=home / ".ssh" / "authorized_keys",
        pid_file=directory / "sshd.pid",
        env=env,
        sftp_server=next((p for p in SFTP_SERVERS if Path(p).exists()), None),
    )
    (directory / "sshd_config").write_text(kit.sshd_config_text(config))


def _passwd(host_passwd: str, home: str) -> str:
    """This machine's passwd with root's home moved to the machine's login home."""
    lines = []
    for line in host_passwd.splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[0] == "root":
            fields[5] = home
            line = ":".join(fields)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _sshd() -> str:
    found = "/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else shutil.which("sshd")
    if not found:
        raise AssertionError("fleet machines need OpenSSH's sshd (apt-get install openssh-server)")
    return str(Path(found).absolute())


def _wait_ready(machine: FleetMachine) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not kit.answers_ssh(machine.address, machine.port):
        if time.monotonic() > deadline:
            log = (machine.directory / "sshd.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"machine {machine.name} did not answer SSH:\n{log}")
        time.sleep(0.05)


def _end(machine: FleetMachine) -> None:
    with contextlib.suppress(AssertionError):
        machine.kill()
    subprocess.run(["ip", "link", "del", "dev", machine.veth], capture_output=True)
    subprocess.run(["ip", "netns", "del", machine.name], capture_output=True)
