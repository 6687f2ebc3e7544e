"""Pure builders for sandbox hosts: names, `ip` argv, the AMI user's files, cloud-init's part.

A host stands for one EC2 instance `i-...`:

- network namespace `osbx-<instance id>`, attached to the sandbox bridge by a veth pair whose
  host end is `sx<12 hex>` and whose inner end is `ens5` (the NIC name of EC2's Nitro types,
  which is what orch tells gloo/NCCL to use), holding the instance's private IP;
- 169.254.169.254 on the namespace's `lo`, where the metadata endpoint listens;
- a private mount namespace in which the host's disk is its user's home, and `/etc/passwd`,
  `/etc/hosts` and `/etc/resolv.conf` are the host's own (the passwd adds the AMI's login user
  `ubuntu`, uid 0, so the installed software of this machine is the image's software).

These names differ from the local provider's (`orch-l-...`, `ov-...`, `eth0`), so neither ever
touches the other's namespaces.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from orchestrator.sandbox.network import SandboxNetwork

NETNS_PREFIX = "osbx-"
VETH_PREFIX = "sx"
HOST_INTERFACE = "ens5"
MARKER = "ORCH_SANDBOX_HOST"  # environment variable carried by every process of a host
IMDS_ADDRESS = "169.254.169.254"
IMDS_PORT = 80
LOGIN_USER = "ubuntu"
CLOUD_CONFIG_HEADER = "#cloud-config"
SHUTDOWN_DIR = "/usr/local/sbin"  # where a host finds its `shutdown` (the sandbox's own)
SHUTDOWN_REQUEST = "shutdown-requested"  # in the host's directory, written by that `shutdown`


def netns_name(instance_id: str) -> str:
    """The network namespace of a host."""
    return NETNS_PREFIX + instance_id


def veth_name(instance_id: str) -> str:
    """Host end of a host's veth pair (14 characters: fits Linux's 15-character limit)."""
    return VETH_PREFIX + hashlib.sha256(instance_id.encode()).hexdigest()[:12]


def is_instance_id(value: str) -> bool:
    """Whether `value` looks like an EC2 instance id (guards paths built from ids)."""
    rest = value.removeprefix("i-")
    return rest != value and 8 <= len(rest) <= 32 and all(c in "0123456789abcdef" for c in rest)


# --- ip argv ------------------------------------------------------------------------------------


def bridge_setup_argvs(network: SandboxNetwork) -> list[list[str]]:
    """Create the bridge with the gateway address and bring it up (bridge absent)."""
    return [
        ["ip", "link", "add", "name", network.bridge, "type", "bridge"],
        ["ip", "addr", "add", network.bridge_cidr, "dev", network.bridge],
        ["ip", "link", "set", "dev", network.bridge, "up"],
    ]


def bridge_delete_argv(network: SandboxNetwork) -> list[str]:
    return ["ip", "link", "del", "dev", network.bridge]


def host_net_setup_argvs(instance_id: str, ip: str, network: SandboxNetwork) -> list[list[str]]:
    """Build a host's namespace: veth on the bridge, `ens5` with the private IP, the metadata
    address on `lo`, default route via the bridge."""
    ns, veth = netns_name(instance_id), veth_name(instance_id)
    return [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", HOST_INTERFACE, "netns", ns],
        ["ip", "link", "set", "dev", veth, "master", network.bridge],
        ["ip", "link", "set", "dev", veth, "up"],
        ["ip", "-n", ns, "addr", "add", f"{ip}/{network.cidr.prefixlen}", "dev", HOST_INTERFACE],
        ["ip", "-n", ns, "link", "set", "dev", "lo", "up"],
        ["ip", "-n", ns, "addr", "add", f"{IMDS_ADDRESS}/32", "dev", "lo"],
        ["ip", "-n", ns, "link", "set", "dev", HOST_INTERFACE, "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", str(network.gateway)],
    ]


def link_down_argv(instance_id: str) -> list[str]:
    """Cut a host off the bridge at once (its connections hang, as when a machine dies)."""
    return ["ip", "link", "set", "dev", veth_name(instance_id), "down"]


def host_net_teardown_argvs(instance_id: str) -> list[list[str]]:
    """Remove a host's veth pair and namespace (each may fail if already gone)."""
    return [
        ["ip", "link", "del", "dev", veth_name(instance_id)],
        ["ip", "netns", "del", netns_name(instance_id)],
    ]


def netns_pids_argv(instance_id: str) -> list[str]:
    return ["ip", "netns", "pids", netns_name(instance_id)]


# --- the image: login user, programs ------------------------------------------------------------


def passwd_text(host_passwd: str, home: str, shell: str) -> str:
    """The host's /etc/passwd: this machine's, with the login user `ubuntu` as uid 0 at `home`.

    uid 0 because the image's software is this machine's (venvs under /root included).
    """
    kept = [line for line in host_passwd.splitlines() if line and line.split(":")[0] != LOGIN_USER]
    kept.append(f"{LOGIN_USER}:x:0:0:{LOGIN_USER}:{home}:{shell}")
    return "\n".join(kept) + "\n"


@dataclass(frozen=True)
class HostFiles:
    """Where one host's files are on this machine."""

    disk: Path  # mounted on the user's home inside the host
    etc: Path  # passwd, hosts, resolv.conf of the host
    sshd_config: Path
    sshd_log: Path
    notice_file: Path  # the spot notice, while one is served
    imds_ready: Path  # written by the metadata endpoint once it listens
    imds_log: Path


def host_init_argv(
    instance_id: str,
    files: HostFiles,
    home: str,
    sshd: str,
    python: str,
    role: str | None = None,
    boot: Path | None = None,
) -> list[str]:
    """Boot a host: in its network namespace and a private mount namespace, mount the disk on
    `home` and the host's own passwd, hosts and resolv.conf, run `boot` (see `boot_script`),
    start the metadata endpoint on 169.254.169.254:80 in the background, and `exec` sshd (the
    started pid is sshd's own).

    Both programs see the host's resolv.conf, so neither waits on a DNS server it cannot reach.
    With `role` (the instance's profile), the metadata endpoint serves its credentials.
    """
    script = (
        'mount --bind "$1" "$2" && mount --bind "$3/passwd" /etc/passwd && '
        'mount --bind "$3/hosts" /etc/hosts && mount --bind "$3/resolv.conf" /etc/resolv.conf '
        "|| exit 1\n"
        'if [ -n "${13}" ]; then sh "${13}" || exit 1; fi\n'
        f'"$4" -m orchestrator.node.imds_server --bind {IMDS_ADDRESS} --port {IMDS_PORT} '
        '--instance-id "$5" --notice-file "$6" --ready-file "$7" ${12:+--role "${12}"} '
        '</dev/null >>"$8" 2>&1 &\n'
        'exec "$9" -D -f "${10}" -E "${11}"'
    )
    return [
        "ip", "netns", "exec", netns_name(instance_id),
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", script, "sandbox-host",
        str(files.disk), home, str(files.etc), python, instance_id, str(files.notice_file),
        str(files.imds_ready), str(files.imds_log), sshd, str(files.sshd_config),
        str(files.sshd_log), role or "", str(boot) if boot else "",
    ]  # fmt: skip


def notice_document(at: datetime) -> dict[str, str]:
    """The spot interruption notice EC2 serves at `spot/instance-action`."""
    return {"action": "terminate", "time": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def notice_text(at: datetime) -> str:
    return json.dumps(notice_document(at)) + "\n"


# --- cloud-init: the part that matters to SSH ---------------------------------------------------


@dataclass(frozen=True)
class CloudConfig:
    """What the sandbox honours of an instance's `#cloud-config` user data."""

    authorized_keys: tuple[str, ...] = ()  # `ssh_authorized_keys`
    host_keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> (priv, pub)
    write_files: tuple[WriteFile, ...] = ()  # `write_files` (absolute paths, decoded content)
    runcmd: tuple[str, ...] = ()  # `runcmd`, each as one shell command line


@dataclass(frozen=True)
class WriteFile:
    """One `write_files` entry of a cloud-config."""

    path: str  # absolute, no `..`
    content: bytes
    mode: int  # from `permissions` (default 0644)


def parse_cloud_config(user_data: str) -> CloudConfig:
    """Read `ssh_authorized_keys`, `ssh_keys` (`<type>_private` / `<type>_public`), and
    `write_files` (under `WRITABLE_DIRS`) and `runcmd`.

    Anything that is not a `#cloud-config` document, or not a mapping, is ignored (cloud-init
    would run a script; the sandbox does not), giving an empty config.
    """
    if not user_data.lstrip().startswith(CLOUD_CONFIG_HEADER):
        return CloudConfig()
    try:
        doc = yaml.safe_load(user_data)
    except yaml.YAMLError:
        return CloudConfig()
    if not isinstance(doc, dict):
        return CloudConfig()
    keys = doc.get("ssh_authorized_keys") or []
    authorized = tuple(k.strip() for k in keys if isinstance(k, str) and k.strip())
    raw = doc.get("ssh_keys") or {}
    host_keys: dict[str, tuple[str, str]] = {}
    if isinstance(raw, dict):
        for name, private in raw.items():
            kind = str(name).removesuffix("_private")
            public = raw.get(f"{kind}_public")
            if str(name).endswith("_private") and isinstance(private, str) and public:
                host_keys[kind] = (private, str(public).strip())
    return CloudConfig(
        authorized_keys=authorized,
        host_keys=host_keys,
        write_files=tuple(f for f in map(_write_file, doc.get("write_files") or []) if f),
        runcmd=tuple(c for c in map(_command_line, doc.get("runcmd") or []) if c),
    )


# Where a host takes `write_files`: each file's directory is mounted over this machine's in the
# host's mount namespace, so only directories of a program's own are honoured.
WRITABLE_DIRS = ("/opt/", "/etc/systemd/system/")


def _write_file(entry: object) -> WriteFile | None:
    """A `write_files` entry, decoded (`b64`, `gz+b64`, or plain text); None if unusable or
    outside `WRITABLE_DIRS`."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return None
    path = entry["path"]
    if not path.startswith(WRITABLE_DIRS) or ".." in path.split("/"):
        return None
    raw = entry.get("content", "")
    encoding = str(entry.get("encoding") or "text")
    try:
        if encoding in ("b64", "base64"):
            content = base64.b64decode(str(raw))
        elif encoding in ("gz+b64", "gzip+base64", "gz+base64", "gzip+b64"):
            content = gzip.decompress(base64.b64decode(str(raw)))
        else:
            content = str(raw).encode()
        mode = int(str(entry.get("permissions") or "0644"), 8)
    except (ValueError, binascii.Error, OSError):
        return None
    return WriteFile(path, content, mode)


def _command_line(entry: object) -> str | None:
    """A `runcmd` entry as a shell line: a list is an argv (quoted), a string is shell."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, list) and all(isinstance(word, str) for word in entry):
        return shlex.join(entry)
    return None


def shutdown_script(host_directory: Path) -> str:
    """The host's `shutdown`: it asks the sandbox to end the instance, as EC2 ends an
    instance launched to terminate on shutdown (state reason `Client.InstanceInitiatedShutdown`).
    It never runs this machine's own `shutdown`."""
    request = shlex.quote(str(host_directory / SHUTDOWN_REQUEST))
    return f'#!/bin/sh\necho "shutdown $*" >> {request}\necho "the instance shuts down"\n'


# A host has no systemd: its `systemctl` says so, as on a machine booted without it, rather than
# reach this machine's own systemd through the shared /run.
NO_SYSTEMD_SCRIPT = (
    '#!/bin/sh\necho "System has not been booted with systemd as init system (PID 1)." >&2\n'
    "exit 1\n"
)


def boot_script(config: CloudConfig, root: Path, shutdown_dir: Path, home: str, path: str) -> str:
    """What a host runs at boot, in its mount namespace, before its sshd starts: the files of
    `write_files` (kept under `root`, the host's own) mounted at their directories, the host's
    `shutdown` over SHUTDOWN_DIR, then `runcmd` as cloud-init runs it, detached, as root. No
    systemd runs in a host, so commands that need it fail as on a system without it."""
    lines = ["set -e", f"mount --bind {shlex.quote(str(shutdown_dir))} {SHUTDOWN_DIR}"]
    for directory in sorted({str(Path(f.path).parent) for f in config.write_files}):
        source = shlex.quote(str(root) + directory)
        lines.append(f"mkdir -p {shlex.quote(directory)} && mount --bind {source} "
                     f"{shlex.quote(directory)}")  # fmt: skip
    if config.runcmd:
        commands = "\n".join(config.runcmd)
        log = shlex.quote(str(root.parent / "cloud-init.log"))
        lines.append(
            f"(cd / && HOME={shlex.quote(home)} PATH={shlex.quote(path)} setsid sh -c "
            f"{shlex.quote(commands)} </dev/null >>{log} 2>&1 &)"
        )
    return "\n".join(lines) + "\n"


def authorized_keys_text(key_pair_public: str | None, config: CloudConfig) -> str:
    """authorized_keys: the launch key pair's public key, then the user data's; a key that is
    already listed (same type and key, whatever its comment) is not repeated."""
    lines: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for key in ([key_pair_public] if key_pair_public else []) + list(config.authorized_keys):
        fields = tuple(key.split()[:2])
        if len(fields) == 2 and fields not in seen:
            seen.add(fields)
            lines.append(key.strip() + "\n")
    return "".join(lines)
