"""Sandbox hosts: one network namespace, sshd, disk and metadata endpoint per EC2 instance.

`HostFleet.build(spec)` turns a launched instance into a machine orch can log into, as its
cloud-init would: the user data's host key and the key pair's public key are installed, its
`write_files` (under /opt/ and /etc/systemd/system/) are put in place and its `runcmd` run, sshd
listens on port 22 of the instance's private IP, and the metadata endpoint answers at
169.254.169.254 inside the host. `end(instance_id)` takes the link down first and then kills
every process of the host at once, like a machine that lost power, before removing its
namespace, veth and directory (disk included: the root volume is deleted on termination), and
the cgroups its containers' podman left on this machine. A
host's own `shutdown` (the only one it can run) asks for its instance to end, which the
materializer does with EC2's state reason for it (`Client.InstanceInitiatedShutdown`).

Layout under the fleet's root (the sandbox's state directory):

    home/                    mount point of every host's disk (the user's HOME), same path on all
    hosts/<id>/disk/         the host's private disk
    hosts/<id>/etc/          passwd, hosts, resolv.conf of the host
    hosts/<id>/ssh_host_*    host key; authorized_keys; sshd_config; sshd.log
    hosts/<id>/notice.json   the spot notice while one is served; imds.log, imds.ready
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path

import orchestrator
from orchestrator.providers.local import kit
from orchestrator.providers.local.containers import remove_leftover_cgroups
from orchestrator.sandbox import hostnet
from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.network import SUBNET_PREFIX, SandboxNetwork

SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
)
READY_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class HostSpec:
    """What a host is built from: the instance as EC2 describes it, and its launch inputs."""

    instance_id: str
    private_ip: str
    zone: str
    user_data: str  # decoded user data ("" when none)
    key_pair_public: str | None  # public key of the launch key pair, if any
    role: str | None = None  # its instance profile's name: the metadata serves credentials


@dataclass(frozen=True)
class Host:
    """A built host."""

    instance_id: str
    private_ip: str
    zone: str
    directory: Path
    role: str | None = None

    @property
    def files(self) -> hostnet.HostFiles:
        d = self.directory
        return hostnet.HostFiles(
            disk=d / "disk",
            etc=d / "etc",
            sshd_config=d / "sshd_config",
            sshd_log=d / "sshd.log",
            notice_file=d / "notice.json",
            imds_ready=d / "imds.ready",
            imds_log=d / "imds.log",
        )

    @property
    def notice_file(self) -> Path:
        return self.files.notice_file

    def as_dict(self) -> dict[str, str]:
        return {
            "instance_id": self.instance_id,
            "private_ip": self.private_ip,
            "zone": self.zone,
            "namespace": hostnet.netns_name(self.instance_id),
        }


class HostFleet:
    """The hosts of one sandbox. Thread-safe; `end` and `end_all` are idempotent."""

    def __init__(self, root: Path, network: SandboxNetwork, *, log: Callable[[str], None]) -> None:
        self.root = root
        self.network = network
        self.log = log
        self.home = root / "home"
        self.hosts_dir = root / "hosts"
        self._hosts: dict[str, Host] = {}
        self._busy: dict[str, threading.RLock] = {}  # per host: its build or its end
        self._lock = threading.Lock()  # guards the two dicts
        self._sshd = _sshd_binary()

    # --- queries --------------------------------------------------------------------------------

    def get(self, instance_id: str) -> Host | None:
        with self._lock:
            return self._hosts.get(instance_id)

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._hosts)

    def all(self) -> list[Host]:
        with self._lock:
            return sorted(self._hosts.values(), key=lambda h: h.instance_id)

    # --- build ----------------------------------------------------------------------------------

    def build(
        self,
        spec: HostSpec,
        *,
        ssh_delay_s: float = 0.0,
        on_network: Callable[[], None] | None = None,
    ) -> Host:
        """Bring the host of `spec` up; returns once its sshd and metadata endpoint answer.

        `on_network` is called once the host's network is up, before anything runs in it;
        its programs (sshd, the metadata endpoint) start `ssh_delay_s` seconds later, like an
        image that boots slowly. On failure whatever was made is removed again and
        `SandboxError` says why.
        """
        iid = spec.instance_id
        if not hostnet.is_instance_id(iid) or not self.network.holds(spec.private_ip):
            raise SandboxError(f"cannot build a host for {iid!r} at {spec.private_ip!r}")
        directory = self.hosts_dir / iid
        host = Host(iid, spec.private_ip, spec.zone, directory, spec.role)
        with self._lock:
            if iid in self._hosts:
                return self._hosts[iid]
            # Registered before anything is made, so `end` can always find it; an `end` that
            # comes while the host is being built waits for the build to finish.
            self._hosts[iid] = host
            busy = self._busy[iid] = threading.RLock()
        with busy:
            try:
                self._prepare_files(spec, directory)
                for argv in hostnet.host_net_setup_argvs(iid, spec.private_ip, self.network):
                    kit.run_checked(argv)
                if on_network is not None:
                    on_network()
                time.sleep(max(0.0, ssh_delay_s))
                self._start(host)
                self._wait_ready(host)
            except BaseException as exc:
                self.end(iid)
                if isinstance(exc, SandboxError) or not isinstance(exc, Exception):
                    raise
                raise SandboxError(f"host {iid} could not be built: {exc}") from exc
        return host

    def _prepare_files(self, spec: HostSpec, directory: Path) -> None:
        config = hostnet.parse_cloud_config(spec.user_data)
        (directory / "disk").mkdir(mode=0o700, parents=True)
        directory.chmod(0o700)
        self.home.mkdir(mode=0o755, parents=True, exist_ok=True)
        key_file = directory / "ssh_host_ed25519_key"
        if "ed25519" in config.host_keys:
            private, public = config.host_keys["ed25519"]
            key_file.write_text(private if private.endswith("\n") else private + "\n")
            key_file.chmod(0o600)
            key_file.with_suffix(".pub").write_text(public + "\n")
        else:  # no key handed over: generate one, as cloud-init does
            kit.run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)])
        authorized = hostnet.authorized_keys_text(spec.key_pair_public, config)
        (directory / "authorized_keys").write_text(authorized)
        etc = directory / "etc"
        etc.mkdir()
        shell = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"
        passwd = Path("/etc/passwd").read_text()
        (etc / "passwd").write_text(hostnet.passwd_text(passwd, str(self.home), shell))
        # its peers are in its zone's subnet: named too, so torch's c10d finds their names
        zone = IPv4Network(f"{spec.private_ip}/{SUBNET_PREFIX}", strict=False)
        hosts = kit.node_hosts_text(spec.private_ip, os.uname().nodename, zone)
        (etc / "hosts").write_text(hosts)
        (etc / "resolv.conf").write_text(kit.NODE_RESOLV_CONF)
        venv_bin = Path(sys.prefix) / "bin"
        env = {
            "HOME": str(self.home),
            "PATH": kit.node_path(str(self.home), venv_bin),
            hostnet.MARKER: spec.instance_id,
        }
        self._prepare_boot(config, directory, env["PATH"])
        (directory / "sshd_config").write_text(
            kit.sshd_config_text(
                kit.SshdConfig(
                    listen="0.0.0.0:22",
                    host_key=key_file,
                    authorized_keys=directory / "authorized_keys",
                    pid_file=directory / "sshd.pid",
                    env=env,
                    sftp_server=next((p for p in SFTP_SERVERS if Path(p).exists()), None),
                )
            )
        )

    def _prepare_boot(self, config: hostnet.CloudConfig, directory: Path, path: str) -> None:
        """The host's part of cloud-init: its `write_files` under `root/`, its own `shutdown`,
        and the boot script that mounts them and runs `runcmd` (see `hostnet.boot_script`)."""
        root = directory / "root"
        for item in config.write_files:
            target = root / item.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(item.content)
            target.chmod(item.mode)
        sbin = directory / "sbin"
        sbin.mkdir()
        (sbin / "shutdown").write_text(hostnet.shutdown_script(directory))
        (sbin / "systemctl").write_text(hostnet.NO_SYSTEMD_SCRIPT)
        for program in ("shutdown", "systemctl"):
            (sbin / program).chmod(0o755)
        (directory / "boot.sh").write_text(
            hostnet.boot_script(config, root, sbin, str(self.home), path)
        )

    def shutdown_requested(self) -> list[str]:
        """Hosts whose own `shutdown` ran: their instances end as EC2 ends one on shutdown."""
        return [
            h.instance_id for h in self.all() if (h.directory / hostnet.SHUTDOWN_REQUEST).exists()
        ]

    def _start(self, host: Host) -> None:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        argv = hostnet.host_init_argv(
            host.instance_id, host.files, str(self.home), self._sshd, sys.executable, host.role,
            host.directory / "boot.sh",
        )  # fmt: skip
        env = {
            "PATH": ":".join(kit.SYSTEM_PATH),
            "PYTHONPATH": str(Path(orchestrator.__file__).resolve().parents[1]),
            hostnet.MARKER: host.instance_id,
        }
        subprocess.run(
            kit.detached_argv(argv, host.files.sshd_log),
            env=env, cwd="/", capture_output=True, check=True,
        )  # fmt: skip

    def _wait_ready(self, host: Host) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = host.files.imds_ready
        while not (ready.exists() and kit.answers_ssh(host.private_ip, 22)):
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"host {host.instance_id} did not come up within {READY_TIMEOUT_S:.0f} s:\n"
                    + _tail(host.files.sshd_log)
                    + _tail(host.files.imds_log)
                )
            time.sleep(0.05)

    # --- end ------------------------------------------------------------------------------------

    def end(self, instance_id: str) -> bool:
        """Cut the host off, kill all its processes at once, remove it. False if none was left."""
        with self._lock:
            host, busy = self._hosts.get(instance_id), self._busy.get(instance_id)
        if host is None or busy is None:
            return False
        with busy:
            with self._lock:
                if self._hosts.get(instance_id) is not host:
                    return False  # ended meanwhile
            end_host(instance_id, host.directory)
            with self._lock:
                del self._hosts[instance_id]
                del self._busy[instance_id]
        return True

    def end_all(self) -> None:
        for iid in sorted(self.ids()):
            self.end(iid)


def end_host(instance_id: str, directory: Path | None) -> None:
    """End one host, whether the fleet knows it or it was left by an earlier sandbox."""
    subprocess.run(hostnet.link_down_argv(instance_id), capture_output=True, check=False)
    if not kit.sweep(lambda: _host_pids(instance_id)):
        raise SandboxError(f"processes of host {instance_id} survive SIGKILL")
    for argv in hostnet.host_net_teardown_argvs(instance_id):
        subprocess.run(argv, capture_output=True, check=False)
    remove_leftover_cgroups()  # those podman made for the host's containers, now empty
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _host_pids(instance_id: str) -> set[int]:
    """Pids in the host's namespace, and any process carrying its marker."""
    pids: set[int] = set()
    out = subprocess.run(
        hostnet.netns_pids_argv(instance_id), capture_output=True, text=True, check=False
    )
    if out.returncode == 0:
        pids |= {int(tok) for tok in out.stdout.split() if tok.isdigit()}
    return pids | kit.pids_with_env(hostnet.MARKER, instance_id)


def kill_namespace(name: str) -> None:
    """Kill every process in the network namespace `name` (stale hosts of a dead sandbox)."""
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    kit.kill_all(int(tok) for tok in out.stdout.split() if tok.isdigit())


def _sshd_binary() -> str:
    found = "/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else shutil.which("sshd")
    if not found:
        raise SandboxError("sandbox hosts need OpenSSH's sshd", hint="install openssh-server")
    return str(Path(found).absolute())


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path.name}: none)\n"
    return f"--- {path.name} ---\n" + "\n".join(text.splitlines()[-lines:]) + "\n"
