"""Pure builders for the local provider: node names, addresses, `ip` argv, sshd_config text.

Nothing here touches the system; `local.provider` and `local.starting` run what these
functions build.
Keeping them pure lets the unit tests read like the spec of a local node:

- a node `l-<10 hex>` lives in network namespace `orch-<id>`, attached to a host bridge by a veth
  pair whose host end is `ov-<10 hex>` and whose inner end is `eth0`;
- the bridge holds the subnet's first address; nodes take the next free ones;
- in namespace mode every node's private disk is bind-mounted on the same path, `NODE_HOME`,
  inside a mount namespace of its own, so all nodes see the same HOME path but their own files;
- a namespace node's hostname is its address as EC2 writes it (`ip-10-213-0-2`), and its own
  /etc/hosts names it and every address its peers can have, so names resolve both ways
  without a name server.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from itertools import islice
from pathlib import Path

from orchestrator.errors import CapacityError

NODE_HOME = "/run/orch-node"  # HOME of every namespace-mode node, private to each node
NODE_MARKER = "ORCH_LOCAL_NODE"  # environment variable carried by every process of a node
NETNS_PREFIX = "orch-"
VETH_PREFIX = "ov-"
NODE_INTERFACE = "eth0"  # the node's side of its veth pair, inside the namespace
IFNAME_MAX = 15  # Linux IFNAMSIZ - 1
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

_ID_RE = re.compile(r"^l-[0-9a-f]{10}$")


def new_instance_id() -> str:
    """A fresh random node id, `l-` and 10 hex digits (unique across processes and homes)."""
    return "l-" + secrets.token_hex(5)


def is_instance_id(value: str) -> bool:
    """Whether `value` has the shape of a local node id (guards paths built from ids)."""
    return bool(_ID_RE.match(value))


def netns_name(instance_id: str) -> str:
    """Name of the network namespace of a node."""
    return NETNS_PREFIX + instance_id


def host_veth_name(instance_id: str) -> str:
    """Name of the host end of a node's veth pair; fits the 15-character interface name limit."""
    name = VETH_PREFIX + instance_id.removeprefix("l-")
    if len(name) > IFNAME_MAX:
        raise ValueError(f"interface name {name!r} is longer than {IFNAME_MAX} characters")
    return name


def neigh_flush_argvs(ip: str, bridge: str, namespaces: Iterable[str]) -> list[list[str]]:
    """Commands that make the bridge and each of `namespaces` forget the link-layer address
    they hold for `ip` (a node that had it is gone; a new one has it now)."""
    return [
        ["ip", "neigh", "flush", "to", ip, "dev", bridge],
        *(["ip", "-n", ns, "neigh", "flush", "to", ip] for ns in namespaces),
    ]


def bridge_address(subnet: IPv4Network) -> IPv4Address:
    """The bridge's address: the subnet's first host address (the nodes' default gateway)."""
    return next(subnet.hosts())


def allocate_ips(subnet: IPv4Network, used: Iterable[str], count: int) -> list[str]:
    """The `count` lowest host addresses of `subnet` not in `used` and not the bridge's.

    Raises `CapacityError` when the subnet has fewer free addresses than asked for.
    """
    taken = {str(ip) for ip in used} | {str(bridge_address(subnet))}
    free: list[str] = []
    for host in subnet.hosts():
        if str(host) not in taken:
            free.append(str(host))
            if len(free) == count:
                return free
    raise CapacityError(
        f"the local subnet {subnet} has {len(free)} free addresses, {count} are needed",
        hint="terminate unused local nodes (orch down --all) or set local.subnet to a larger one",
    )


# --- ip argv ------------------------------------------------------------------------------------


def bridge_create_argvs(bridge: str, subnet: IPv4Network) -> list[list[str]]:
    """Commands that create the bridge with its address and bring it up (bridge absent)."""
    return [
        ["ip", "link", "add", "name", bridge, "type", "bridge"],
        bridge_addr_argv(bridge, subnet),
        ["ip", "link", "set", "dev", bridge, "up"],
    ]


def bridge_addr_argv(bridge: str, subnet: IPv4Network) -> list[str]:
    """Command that gives the bridge its gateway address (`replace`: idempotent)."""
    cidr = f"{bridge_address(subnet)}/{subnet.prefixlen}"
    return ["ip", "addr", "replace", cidr, "dev", bridge]


def bridge_delete_argv(bridge: str) -> list[str]:
    """Command that removes the bridge."""
    return ["ip", "link", "del", "dev", bridge]


def bridge_ports_argv(bridge: str) -> list[str]:
    """Command that lists (as JSON) the interfaces attached to the bridge."""
    return ["ip", "-j", "link", "show", "master", bridge]


def node_net_setup_argvs(
    instance_id: str, ip: str, subnet: IPv4Network, bridge: str
) -> list[list[str]]:
    """Commands that build a node's namespace: veth pair, address, loopback, default route."""
    ns = netns_name(instance_id)
    veth = host_veth_name(instance_id)
    return [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", ns],
        ["ip", "link", "set", "dev", veth, "master", bridge],
        ["ip", "link", "set", "dev", veth, "up"],
        ["ip", "-n", ns, "addr", "add", f"{ip}/{subnet.prefixlen}", "dev", NODE_INTERFACE],
        ["ip", "-n", ns, "link", "set", "dev", "lo", "up"],
        ["ip", "-n", ns, "link", "set", "dev", NODE_INTERFACE, "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", str(bridge_address(subnet))],
    ]


def node_net_teardown_argvs(instance_id: str) -> list[list[str]]:
    """Commands that remove a node's veth pair and namespace (each may fail if already gone)."""
    return [
        ["ip", "link", "del", "dev", host_veth_name(instance_id)],
        ["ip", "netns", "del", netns_name(instance_id)],
    ]


def netns_pids_argv(instance_id: str) -> list[str]:
    """Command that prints the pids of every process in a node's namespace."""
    return ["ip", "netns", "pids", netns_name(instance_id)]


def netns_addrs_argv(ns: str) -> list[str]:
    """Command that lists (as JSON) the IPv4 addresses inside a namespace."""
    return ["ip", "-j", "-n", ns, "-4", "addr", "show"]


def parse_addr_json(text: str) -> set[str]:
    """IPv4 addresses in the output of `ip -j -4 addr show` (loopback addresses left out)."""
    try:
        links = json.loads(text or "[]")
    except ValueError:
        return set()
    return {
        info["local"]
        for link in links
        for info in link.get("addr_info", [])
        if info.get("family") == "inet"
        and "local" in info
        and not IPv4Address(info["local"]).is_loopback
    }


# --- sshd ---------------------------------------------------------------------------------------

# sshd's ForceCommand, run by the login shell (POSIX sh syntax): start every session in HOME
# (sshd itself would start it in the passwd home directory), then run what the client asked for
# exactly as sshd would (`$SHELL -c command`, or a plain shell when there is no command).
SESSION_COMMAND = (
    'cd "$HOME" || exit 1; c=$SSH_ORIGINAL_COMMAND; unset SSH_ORIGINAL_COMMAND; '
    'exec "$SHELL" -c "${c:-exec $SHELL}"'
)


@dataclass(frozen=True)
class SshdConfig:
    """Everything that differs between two nodes' sshd_config files."""

    listen: str  # "0.0.0.0:22" in a namespace, "127.0.0.1:<port>" on loopback
    host_key: Path  # private host key file
    authorized_keys: Path  # keys allowed to log in
    pid_file: Path
    env: Mapping[str, str]  # session environment (HOME, PATH, the node marker)
    sftp_server: str | None  # external sftp-server program; None: internal-sftp, no ForceCommand


def _quote(value: str) -> str:
    if '"' in value or "\n" in value:
        raise ValueError(f"cannot write {value!r} into sshd_config")
    return f'"{value}"'


def _path_token(path: Path) -> str:
    # AuthorizedKeysFile expands % tokens; a literal % is written %%.
    return _quote(str(path).replace("%", "%%"))


def authorized_keys_files(cfg: SshdConfig) -> list[Path]:
    """The files whose keys may log in: the provider's, then `~/.ssh/authorized_keys` of the
    session's HOME (as on an EC2 node), where a transfer between nodes adds its one-time key.
    An absolute path: sshd would read a relative one under the login user's passwd home,
    which a node running as root shares with the host."""
    files = [cfg.authorized_keys]
    if home := cfg.env.get("HOME"):
        files.append(Path(home) / ".ssh" / "authorized_keys")
    return files


def sshd_config_text(cfg: SshdConfig) -> str:
    """The sshd_config of one node: key-only login, the node's session environment, no PAM."""
    set_env = " ".join(_quote(f"{k}={v}") for k, v in cfg.env.items())
    lines = [
        f"ListenAddress {cfg.listen}",
        f"HostKey {_quote(str(cfg.host_key))}",
        f"PidFile {_quote(str(cfg.pid_file))}",
        f"AuthorizedKeysFile {' '.join(_path_token(p) for p in authorized_keys_files(cfg))}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "ClientAliveInterval 5",
        "ClientAliveCountMax 3",
        "MaxSessions 64",
        "MaxStartups 64",
        "LogLevel INFO",
        f"SetEnv {set_env}",
    ]
    if cfg.sftp_server:
        lines.append(f"Subsystem sftp {cfg.sftp_server}")
        lines.append(f"ForceCommand {SESSION_COMMAND}")
    else:
        lines.append("Subsystem sftp internal-sftp")
    return "\n".join(lines) + "\n"


def node_path(home: str, venv_bin: Path) -> str:
    """PATH of a node's sessions: node-local tools, the shared venv, then the system."""
    return ":".join([f"{home}/bin", str(venv_bin), *SYSTEM_PATH])


def node_session_env(instance_id: str, home: str, venv_bin: Path) -> dict[str, str]:
    """Environment sshd sets for every session of the node (`SetEnv`)."""
    return {"HOME": home, "PATH": node_path(home, venv_bin), NODE_MARKER: instance_id}


NAMED_ADDRESSES = 1024  # addresses of the subnet a node's hosts file names (the lowest ones)


def node_hostname(ip: str) -> str:
    """The hostname of the namespace node at `ip`, as EC2 names its nodes: `ip-10-213-0-2`."""
    return "ip-" + str(IPv4Address(ip)).replace(".", "-")


def node_hosts_text(ip: str, hostname: str, subnet: IPv4Network | None = None) -> str:
    """/etc/hosts of a namespace node: its own name resolves to its own address and back.

    With `subnet`, every one of its `NAMED_ADDRESSES` lowest host addresses is named too
    (`node_hostname`), so that a node resolves its peers' addresses, a replacement node's
    included, without a name server: torch's c10d looks up the name of every socket's peer
    and warns ("The hostname of the client socket cannot be retrieved") where it has none.
    Nodes take the subnet's lowest free addresses, so the named ones are those in use. Each
    address is named in its IPv4-mapped IPv6 form as well (`::ffff:10.213.0.2`): that is how
    a dual-stack listener, such as c10d's store, sees an IPv4 peer, and glibc finds a name
    for it only in a line of that form.
    """
    named = [(ip, hostname)]
    if subnet is not None:
        addresses = (str(a) for a in islice(subnet.hosts(), NAMED_ADDRESSES))
        named += [(a, node_hostname(a)) for a in addresses if a != ip]
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{address} {name}" for address, name in named]
    lines += [f"::ffff:{address} {name}" for address, name in named]
    return "\n".join(lines) + "\n"


# A namespace node has no route to the host's name servers: a lookup that is not in its hosts
# file must fail at once (nothing listens on the node's own port 53), not after a DNS timeout
# (torch's c10d reverse-resolves peers and would stall 10 s per connection).
NODE_RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def namespaced_sshd_argv(
    instance_id: str,
    disk: Path,
    sshd: str,
    config: Path,
    log: Path,
    etc_dir: Path,
    boot: str = "",
    hostname: str = "",
) -> list[str]:
    """Start sshd inside the node's namespace, with the node's disk mounted on `NODE_HOME`,
    its own `hosts` and `resolv.conf` (from `etc_dir`) over the host's, and `hostname` as its
    own (the host's when empty).

    `boot` (shell text) is what the node starts at boot, before sshd: it runs detached, in
    the node's namespaces, as cloud-init's commands run before anyone logs in to a machine.
    The mounts live in a private mount namespace and the hostname in a UTS namespace, so other
    nodes and the host never see them.
    sshd replaces each process in the chain (`exec`), so the started pid is sshd's own.
    """
    script = (
        '{ [ -z "$8" ] || echo "$8" > /proc/sys/kernel/hostname; } && '
        'mkdir -p "$2" && mount --bind "$1" "$2" && mount --bind "$6/hosts" /etc/hosts && '
        'mount --bind "$6/resolv.conf" /etc/resolv.conf && '
        '{ [ -z "$7" ] || setsid sh -c "$7" </dev/null >/dev/null 2>&1 & } && '
        'exec "$3" -D -f "$4" -E "$5"'
    )
    return [
        "ip", "netns", "exec", netns_name(instance_id),
        "unshare", "--mount", "--uts", "--propagation", "private",
        "sh", "-c", script, "orch-node", str(disk), NODE_HOME, sshd, str(config), str(log),
        str(etc_dir), boot, hostname,
    ]  # fmt: skip


def loopback_sshd_argv(sshd: str, config: Path, log: Path) -> list[str]:
    """Start sshd in the foreground on the host's loopback interface."""
    return [sshd, "-D", "-f", str(config), "-E", str(log)]


def detached_argv(argv: list[str], log: Path) -> list[str]:
    """Start `argv` in a session of its own, not as our child, and print its pid.

    A node must not be a child of the process that launched it (it outlives it, like a machine
    outlives the terminal that booted it), so `sh` starts it in the background and exits; the
    pid printed is the node's, as every program in the chain `exec`s the next.
    """
    script = 'log=$1; shift; setsid "$@" </dev/null >>"$log" 2>&1 & echo $!'
    return ["sh", "-c", script, "orch-node", str(log), *argv]


def host_key_line(pub_text: str) -> str:
    """`type base64` of an OpenSSH public key file's text (the comment dropped)."""
    fields = pub_text.split()
    if len(fields) < 2 or not fields[0].startswith(("ssh-", "ecdsa-")):
        raise ValueError(f"not an OpenSSH public key: {pub_text[:40]!r}")
    return f"{fields[0]} {fields[1]}"


POWEROFF_MODULE = "orchestrator.providers.local.poweroff"
"""The program a local node runs to power itself off (see `local.poweroff`)."""


def poweroff_command(home: Path, instance_id: str, root: Path | None = None) -> str:
    """The node's poweroff command: run detached, without the node's marker in its
    environment, so that it is not among the processes it ends. `root`: the provider's
    `local.root` when set (else ORCH_HOME/local)."""
    argv = [sys.executable, "-m", POWEROFF_MODULE, "--home", str(home), instance_id]
    package_root = str(Path(__file__).resolve().parents[3])
    log = shlex.quote(str((root or home / "local") / "poweroff.log"))
    where = f"ORCH_LOCAL_ROOT={shlex.quote(str(root))} " if root is not None else ""
    return (
        f"env -u {NODE_MARKER} {where}PYTHONPATH={shlex.quote(package_root)} setsid "
        f"{shlex.join(argv)} >> {log} 2>&1 < /dev/null &"
    )
