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

import hashlib
import json
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
    instance_id: str, files: HostFiles, home: str, sshd: str, python: str, role: str | None = None
) -> list[str]:
    """Boot a host: in its network namespace and a private mount namespace, mount the disk on
    `home` and the host's own passwd, hosts and resolv.conf, start the metadata endpoint on
    169.254.169.254:80 in the background, and `exec` sshd (the started pid is sshd's own).

    Both programs see the host's resolv.conf, so neither waits on a DNS server it cannot reach.
    With `role` (the instance's profile), the metadata endpoint serves its credentials.
    """
    script = (
        'mount --bind "$1" "$2" && mount --bind "$3/passwd" /etc/passwd && '
        'mount --bind "$3/hosts" /etc/hosts && mount --bind "$3/resolv.conf" /etc/resolv.conf '
        "|| exit 1\n"
        f'"$4" -m orchestrator.imds_server --bind {IMDS_ADDRESS} --port {IMDS_PORT} '
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
        str(files.sshd_log), role or "",
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


def parse_cloud_config(user_data: str) -> CloudConfig:
    """Read `ssh_authorized_keys` and `ssh_keys` (`<type>_private` / `<type>_public`).

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
    return CloudConfig(authorized_keys=authorized, host_keys=host_keys)


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
