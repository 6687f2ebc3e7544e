"""Starting local nodes: `LocalProvider.launch` decides how many and where, this starts them.

For each node of a launch, `NodeStarter`:
- `prepare`: makes the node's directory (`ORCH_HOME/local/nodes/<id>`) with its ed25519 host key
  and its authorized_keys, and returns its record, not yet saved (the provider gives it its
  address or port and saves it);
- `arm_guard`: writes the job's guard and its terms on the node's disk, and returns the boot
  command that starts the guard inside the node;
- `start`: writes the node's sshd_config (in namespace mode also its hosts file, which names
  every address of the subnet a peer can have, and its resolv.conf), starts the boot command
  and sshd, both detached and carrying `ORCH_LOCAL_NODE=<id>`, and saves the record with
  sshd's pid. Billing starts now: the record's `launched_at` is set to this moment;
- `wait_ready`: returns once every node's sshd sends its SSH banner. A loopback sshd whose port
  another program took before sshd bound it is restarted on a fresh port (`PORT_RETRIES` times);
  an sshd that dies otherwise, or does not answer in time, is a `ProviderError` with the tail of
  its log. It does not end the nodes: the provider terminates them.

Local nodes run the venv `local.node_venv` names, else this process's (`node_venv_bin`), first on
their PATH. The node's sshd_config path (`config_path`) is on its sshd's command line, which is
how `LocalProvider.terminate` tells the node's sshd from a process that reused its pid.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.errors import ProviderError
from orchestrator.node import node_kit, runtime
from orchestrator.node.guard_protocol import GuardLayout, local_boot_command
from orchestrator.node.spot_notice import DEFAULT_METADATA_URL
from orchestrator.providers.base import LaunchRequest, Market
from orchestrator.providers.local import net
from orchestrator.providers.local import spot as local_spot
from orchestrator.providers.local.host import answers_ssh, pid_alive, run_checked
from orchestrator.providers.local.net import SshdConfig, poweroff_command
from orchestrator.providers.local.state import LEDGER_TAG, NodeRecord, NodeStore, file_lock

SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
)
PORT_RETRIES = 3  # loopback: restarts of an sshd whose port was taken meanwhile


def sshd_binary() -> str:
    """The absolute path of OpenSSH's sshd; a `ProviderError` when there is none."""
    found = "/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else shutil.which("sshd")
    if not found:
        raise ProviderError(
            "the local provider needs OpenSSH's sshd", hint="install openssh-server"
        )
    return str(Path(found).absolute())


def node_venv_bin(settings: Settings) -> Path:
    """The bin/ of the venv local nodes run (`local.node_venv`, else this process's)."""
    return (settings.local.node_venv or Path(sys.prefix)) / "bin"


class NodeStarter:
    """Starts the nodes whose records `store` keeps. `free_port` gives a loopback port nothing
    listens on and no record claims; it is called with the store's allocation lock held."""

    def __init__(self, settings: Settings, store: NodeStore, free_port: Callable[[], int]) -> None:
        self.settings = settings
        self.store = store
        self._free_port = free_port

    def prepare(
        self,
        iid: str,
        request: LaunchRequest,
        rank: int,
        mode: str,
        market: Market,
        price_per_hour: Decimal,
    ) -> NodeRecord:
        """Create the node's directory, host key and authorized_keys; return its record."""
        node_dir = self.store.create_dir(iid)
        key_file = node_dir / "ssh_host_ed25519_key"
        run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", iid, "-f", str(key_file)])
        (node_dir / "authorized_keys").write_text(request.public_key.strip() + "\n")
        namespaced = mode == "namespace"
        return NodeRecord(
            instance_id=iid,
            job_id=request.job_id,
            cluster=request.cluster,
            rank=rank,
            mode=mode,
            ip="" if namespaced else "127.0.0.1",
            port=22 if namespaced else 0,
            interface=net.NODE_INTERFACE if namespaced else "lo",
            ssh_user=pwd.getpwuid(os.geteuid()).pw_name,
            home=net.NODE_HOME if namespaced else str(node_dir / "disk"),
            host_key=net.host_key_line(key_file.with_suffix(".pub").read_text()),
            market=market,
            instance_type=f"local-{request.gpus_per_node}x",
            price_per_hour=str(price_per_hour),
            launched_at=datetime.now(UTC).isoformat(),
            tags={
                "orch:job": request.job_id,
                "orch:cluster": request.cluster,
                "orch:rank": str(rank),
                "orch:role": "master" if rank == 0 else "worker",
                **({LEDGER_TAG: request.ledger_id} if request.ledger_id is not None else {}),
            },
        )

    def arm_guard(self, rec: NodeRecord, request: LaunchRequest, hourly: Decimal) -> str:
        """Put the node runtime (`orchestrator.node.runtime`, unless the node holds this
        version) and the job's guard terms on the node's disk; returns the node's boot command
        that starts the guard ("" when the request has no guard)."""
        if request.guard is None:
            return ""
        layout = GuardLayout(request.job_id)
        disk = self.store.node_dir(rec.instance_id) / "disk"
        (disk / layout.root).mkdir(parents=True, exist_ok=True)
        node_runtime = disk / runtime.node_path()
        if not node_runtime.exists():
            node_runtime.parent.mkdir(parents=True, exist_ok=True)
            node_kit.write_file(str(node_runtime), runtime.build())
        (disk / layout.terms).write_text(
            request.guard.for_node(
                now=datetime.now(UTC),
                hourly_usd=hourly,
                poweroff=poweroff_command(
                    self.settings.home, rec.instance_id, self.settings.local.root
                ),
                home=rec.home,
                metadata_url=local_spot.metadata_url(rec) or DEFAULT_METADATA_URL,
            )
        )
        path = net.node_path(rec.home, node_venv_bin(self.settings))
        return local_boot_command(
            rec.home, f"{rec.home}/{runtime.node_path()}", f"{rec.home}/{layout.terms}", path
        )

    def start(self, rec: NodeRecord, sshd: str, boot: str = "") -> int:
        """Write the node's sshd_config, start `boot` (shell text, detached, in the node) and
        its sshd, and return sshd's pid; billing starts now."""
        node_dir = self.store.node_dir(rec.instance_id)
        config, log = Path(self.config_path(rec.instance_id)), node_dir / "sshd.log"
        venv_bin = node_venv_bin(self.settings)
        config.write_text(
            net.sshd_config_text(
                SshdConfig(
                    listen=f"{rec.ip}:{rec.port}" if rec.mode == "loopback" else "0.0.0.0:22",
                    host_key=node_dir / "ssh_host_ed25519_key",
                    authorized_keys=node_dir / "authorized_keys",
                    pid_file=node_dir / "sshd.pid",
                    env=net.node_session_env(rec.instance_id, rec.home, venv_bin),
                    sftp_server=next((p for p in SFTP_SERVERS if Path(p).exists()), None),
                )
            )
        )
        if os.geteuid() == 0:
            # sshd started as root refuses to run without its privilege separation directory,
            # which only a booted system (systemd's tmpfiles) would have made.
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        if rec.mode == "namespace":
            Path(net.NODE_HOME).mkdir(parents=True, exist_ok=True)
            etc_dir = node_dir / "etc"
            etc_dir.mkdir(exist_ok=True)
            hostname = net.node_hostname(rec.ip)
            hosts = net.node_hosts_text(rec.ip, hostname, self.settings.local.subnet)
            (etc_dir / "hosts").write_text(hosts)
            (etc_dir / "resolv.conf").write_text(net.NODE_RESOLV_CONF)
            argv = net.namespaced_sshd_argv(
                rec.instance_id, node_dir / "disk", sshd, config, log, etc_dir, boot, hostname
            )
        else:
            argv = net.loopback_sshd_argv(sshd, config, log)
        env = {"PATH": ":".join(net.SYSTEM_PATH), net.NODE_MARKER: rec.instance_id}
        if boot and rec.mode != "namespace":
            subprocess.run(
                net.detached_argv(["sh", "-c", boot], node_dir / "boot.log"),
                capture_output=True, env=env, cwd="/", check=False,
            )  # fmt: skip
        out = subprocess.run(
            net.detached_argv(argv, log), capture_output=True, text=True, env=env, cwd="/",
            check=False,
        )  # fmt: skip
        if out.returncode != 0 or not out.stdout.strip().isdigit():
            raise ProviderError(f"could not start sshd of local node {rec.instance_id}: {out}")
        rec.sshd_pid = int(out.stdout)
        rec.launched_at = datetime.now(UTC).isoformat()
        self.store.save(rec)
        return rec.sshd_pid

    def wait_ready(self, records: list[NodeRecord], sshd: str, timeout: float) -> None:
        """Return when every node's sshd sends its banner; raise if one dies or `timeout`
        seconds run out."""
        deadline = time.monotonic() + timeout
        pending = {rec.instance_id: rec for rec in records}
        restarts = dict.fromkeys(pending, 0)
        while pending:
            for iid, rec in list(pending.items()):
                alive = pid_alive(rec.sshd_pid or 0)  # its command line changes as it execs
                log = self.log_tail(iid)
                if alive and "Server listening" in log and answers_ssh(rec.ip, rec.port):
                    del pending[iid]
                elif not alive:
                    port_taken = rec.mode == "loopback" and "Address already in use" in log
                    if not port_taken or restarts[iid] >= PORT_RETRIES:
                        raise ProviderError(f"sshd of local node {iid} exited:\n{log}")
                    restarts[iid] += 1
                    self._restart_on_new_port(rec, sshd)
            if pending and time.monotonic() > deadline:
                iid = next(iter(pending))
                raise ProviderError(
                    f"sshd of local node {iid} did not answer within {timeout:.0f} s:"
                    f"\n{self.log_tail(iid)}"
                )
            if pending:
                time.sleep(0.05)

    def config_path(self, instance_id: str) -> str:
        """The node's sshd_config, which its sshd's command line names."""
        return str(self.store.node_dir(instance_id) / "sshd_config")

    def log_tail(self, instance_id: str, lines: int = 20) -> str:
        """The last `lines` lines of the node's sshd log ("(no sshd log)" when unreadable)."""
        try:
            text = (self.store.node_dir(instance_id) / "sshd.log").read_text(errors="replace")
        except OSError:
            return "(no sshd log)"
        return "\n".join(text.splitlines()[-lines:])

    def _restart_on_new_port(self, rec: NodeRecord, sshd: str) -> int:
        """Loopback: another program took the node's port before sshd bound it; take another."""
        with file_lock(self.store.root / "alloc.lock"):
            rec.port = self._free_port()
            self.store.save(rec)
        return self.start(rec, sshd)
