"""Pure: what one allocation of a fleet host is on that host, and what it costs.

An allocation is one node of a job on a machine the user already has: a folder of its own
under the login's home (`~/.orch-fleet/<instance id>`, the node's HOME for everything orch
does there), the job's key in the login's `~/.ssh/authorized_keys` on a line of its own
(ending in `orch-allocation:<instance id>`), its guard, and the slots (GPUs, or process slots
of a CPU host) it holds. Nothing here touches a host; `hosts.py` does, with these texts.
"""

from __future__ import annotations

import secrets
import shlex
from decimal import Decimal

from orchestrator.node import runtime

FLEET_DIR = ".orch-fleet"  # under the login's home: every allocation's home, and the caches
CACHE_DIR = f"{FLEET_DIR}/cache"  # shared by a host's allocations; never removed by a job's end
MARKER_PREFIX = "orch-allocation:"


def new_instance_id() -> str:
    """`s-` and 12 hex digits: unique enough across a ledger's fleets."""
    return f"s-{secrets.token_hex(6)}"


def is_instance_id(text: str) -> bool:
    """Whether `text` has the shape of an allocation id (checked before it goes into a path)."""
    rest = text[2:]
    return text.startswith("s-") and len(rest) == 12 and all(c in "0123456789abcdef" for c in rest)


def allocation_home(login_home: str, instance_id: str) -> str:
    """The allocation's home on the host, an absolute path under the login's home."""
    if not is_instance_id(instance_id):
        raise ValueError(f"not an allocation id: {instance_id!r}")
    return f"{login_home.rstrip('/')}/{FLEET_DIR}/{instance_id}"


def marker(instance_id: str) -> str:
    """The comment that ends the allocation's line in authorized_keys."""
    return f"{MARKER_PREFIX}{instance_id}"


def authorized_line(public_key: str, instance_id: str) -> str:
    """The job key's line: its type and data, then the allocation's marker as its comment
    (the key's own comment is dropped, so the marker is always the line's last word)."""
    parts = public_key.split()
    if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-")):
        raise ValueError("not an OpenSSH public key line")
    return f"{parts[0]} {parts[1]} {marker(instance_id)}"


def prepare_script(instance_id: str, key_line: str) -> str:
    """Shell text run as the login: the allocation's home (0700) and the cache folder, and
    the job key's line added to authorized_keys once (a retried prepare adds nothing); prints
    the login's home."""
    if not is_instance_id(instance_id):
        raise ValueError(f"not an allocation id: {instance_id!r}")
    home, q_line = f'"$HOME/{FLEET_DIR}/{instance_id}"', shlex.quote(key_line)
    return "\n".join(
        [
            "set -e",
            "umask 077",
            f'mkdir -p "$HOME/{CACHE_DIR}" {home}',
            f"chmod 700 {home}",
            'mkdir -p "$HOME/.ssh" && touch "$HOME/.ssh/authorized_keys"',
            f'grep -qxF {q_line} "$HOME/.ssh/authorized_keys" || '
            f'printf "%s\\n" {q_line} >> "$HOME/.ssh/authorized_keys"',
            'echo "login-home=$HOME"',
        ]
    )


def guard_boot(home: str, runtime_path: str, terms_path: str) -> str:
    """The allocation's guard: the runtime's `guard` program with HOME the allocation's, in
    its folder, its output in `guard.log` beside the terms (the login's PATH)."""
    log = terms_path.rsplit("/", 1)[0] + "/guard.log"
    program = runtime.program_command("guard", terms_path, path=runtime_path)
    q_home = shlex.quote(home)
    return f"cd {q_home} && HOME={q_home} exec {program} >> {shlex.quote(log)} 2>&1"


def login_home(output: str) -> str:
    """The login's home as `prepare_script` printed it; raises ValueError on anything else."""
    for line in output.splitlines():
        if line.startswith("login-home="):
            home = line.split("=", 1)[1].strip()
            if home.startswith("/") and len(home) < 4096 and home.isprintable():
                return home
    raise ValueError("the host did not say its home")


def ending_command(runtime_path: str, home: str, instance_id: str) -> str:
    """How the allocation ends (the node program `allocation-end` of the runtime at
    `runtime_path`): the guard's poweroff, and `terminate`'s. A plain command line, whose first
    program (python3) the guard checks before it counts on it."""
    return runtime.program_command(
        "allocation-end", "--home", home, "--marker", marker(instance_id), path=runtime_path
    )


def detached(command: str) -> str:
    """`command` started in a session of its own, its output gone, surviving the SSH session."""
    return f"nohup setsid sh -c {shlex.quote(command)} </dev/null >/dev/null 2>&1 &"


def interface_script(address: str) -> str:
    """Prints the interface that carries `address` on the host (nothing when none does: the
    host is reached through a NAT or a name)."""
    return (
        "ip -o -4 addr show 2>/dev/null | "
        f"awk -v a={shlex.quote(address)} '{{split($4, p, \"/\"); if (p[1] == a) print $2}}' "
        "| head -n 1"
    )


def node_price(price_per_hour: Decimal, unit: str, slots_held: int, host_slots: int) -> Decimal:
    """USD per hour of one allocation: per GPU-hour, the slots it holds; per host-hour, the
    host's price in the share of its slots it holds (a host of 8 GPUs at $8/h bills a 4-GPU
    allocation $4/h). Kept exact; rounded only for display."""
    if unit == "gpu":
        return price_per_hour * slots_held
    if host_slots <= 0:
        return price_per_hour
    return price_per_hour * Decimal(slots_held) / Decimal(host_slots)
