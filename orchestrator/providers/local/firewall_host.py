"""The host's firewall as the local provider meets it: what it holds, and orch's rules in it.

`local.firewall` says which rules and why. Here they are read and changed with the host's own
programs, found on the PATH or in the system's sbin directories:

- `iptables-nft` (or an `iptables` that reports nf_tables): always read; listing it never
  creates a table;
- `iptables-legacy` (or an `iptables` that reports legacy): read only when the kernel already
  has a legacy filter table (`/proc/net/ip_tables_names`), since listing would create one;
- `nft`: the forward chains of families ip and inet that iptables-nft does not manage.

A machine with none of these programs has nothing to read or change. `sync_rules` changes
rules; its callers hold the local provider's host lock, so that two orch processes never race
on one bridge's rules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import ProviderError
from orchestrator.providers.local import firewall as fw
from orchestrator.providers.local.net import SYSTEM_PATH, bridge_ports_argv

PROC = Path("/proc")
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_TIMEOUT_S = 30


@dataclass(frozen=True)
class Iptables:
    """One iptables backend of this host."""

    label: str  # "iptables-nft" or "iptables-legacy"
    binary: str


@dataclass
class Firewall:
    """What the host's firewall holds, read once."""

    iptables: list[tuple[Iptables, fw.IptTable]] = field(default_factory=list)
    nft: str | None = None  # the nft program, when there is one
    chains: list[fw.NftChain] = field(default_factory=list)  # the chains nft handles
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (where, why)

    def stale(self, links: set[str]) -> list[str]:
        """orch's rules for bridges that are not among `links`, said as where they are."""
        found = [
            f"{ipt.label} {rule.chain} for {bridge}"
            for ipt, table in self.iptables
            for rule, bridge in fw.ipt_tagged(table)
            if bridge not in links
        ]
        found += [
            f"{chain.where} for {bridge}"
            for chain in self.chains
            for _, bridge in fw.nft_tagged(chain)
            if bridge not in links
        ]
        return found

    def findings(self, bridge: str) -> list[fw.Finding]:
        """Each chain that bridged traffic passes, for `orch check`."""
        found = [
            fw.Finding(f"{ipt.label} FORWARD", fw.ipt_drops(table), fw.ipt_allows(table, bridge))
            for ipt, table in self.iptables
        ]
        found += [
            fw.Finding(
                chain.where,
                fw.nft_drops(chain),
                fw.nft_allows(chain, bridge),
                managed=chain.addressable,
            )
            for chain in self.chains
        ]
        found += [
            fw.Finding(where, "", False, managed=False, unread=why)
            for where, why in self.unreadable
        ]
        return found


def search_path(path: str | None = None) -> str:
    """Where the firewall's programs are looked for: `path` when given, else PATH and the
    system's sbin directories (a user's PATH often lacks /usr/sbin)."""
    if path is not None:
        return path
    return os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_PATH])


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


def find_iptables(path: str | None = None, proc: Path = PROC) -> tuple[list[Iptables], list[str]]:
    """The iptables backends to read here, and the reasons others cannot be (a legacy filter
    table in use with no legacy iptables to read it)."""
    where = search_path(path)
    plain = shutil.which("iptables", path=where)
    mode = _run([plain, "-V"]).stdout if plain else ""
    nft_bin = shutil.which("iptables-nft", path=where) or (plain if "nf_tables" in mode else None)
    legacy_bin = shutil.which("iptables-legacy", path=where) or (
        plain if plain and "nf_tables" not in mode else None
    )
    found = [Iptables("iptables-nft", nft_bin)] if nft_bin else []
    problems: list[str] = []
    if _legacy_filter_loaded(proc):
        if legacy_bin:
            found.append(Iptables("iptables-legacy", legacy_bin))
        else:
            problems.append("the kernel has a legacy filter table but iptables-legacy is missing")
    return found, problems


def _legacy_filter_loaded(proc: Path) -> bool:
    try:
        # thread-self: the calling thread's network namespace, which may not be the process's
        tables = (proc / "thread-self" / "net" / "ip_tables_names").read_text()
        return "filter" in tables.split()
    except OSError:
        return False


def read_firewall(path: str | None = None, proc: Path = PROC) -> Firewall:
    """Read every backend found here (nothing when the host has none of the programs)."""
    found = Firewall()
    backends, problems = find_iptables(path, proc)
    found.unreadable += [("iptables-legacy", why) for why in problems]
    iptables_nft = False
    for ipt in backends:
        out = _run(fw.ipt_list_argv(ipt.binary))
        if out.returncode != 0:
            found.unreadable.append((ipt.label, out.stderr.strip()[:200] or "failed"))
            continue
        found.iptables.append((ipt, fw.parse_iptables_s(out.stdout)))
        iptables_nft |= ipt.label == "iptables-nft"
    found.nft = shutil.which("nft", path=search_path(path))
    if found.nft:
        out = _run([found.nft, *fw.NFT_LIST_ARGV[1:]])
        if out.returncode == 0:
            found.chains = fw.nft_native(fw.parse_nft_json(out.stdout), iptables_nft=iptables_nft)
        else:
            found.unreadable.append(("nft", out.stderr.strip()[:200] or "failed"))
    return found


def link_names() -> set[str]:
    """The names of this network namespace's interfaces."""
    out = _run(["ip", "-j", "link", "show"])
    try:
        links = json.loads(out.stdout or "[]")
    except ValueError:
        return set()
    return {str(link.get("ifname")) for link in links if isinstance(link, dict)}


def bridge_in_use(bridge: str) -> bool:
    """Whether interfaces (nodes' veths) are attached to `bridge`."""
    out = _run(bridge_ports_argv(bridge))
    return out.returncode == 0 and out.stdout.strip() not in ("", "[]")


def bridge_nf_call_iptables(path: Path = BRIDGE_NF) -> str | None:
    """`net.bridge.bridge-nf-call-iptables` of this network namespace (None: br_netfilter is
    not loaded)."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def sync_rules(
    bridge: str, *, wanted: bool, strict: bool = False, path: str | None = None
) -> list[str]:
    """Make orch's rules match the host's bridges; the caller holds the host lock.

    orch's rules for bridges that are no interface here any more (a crash left them), and for
    `bridge` itself unless `wanted`, are removed. When `wanted` (nodes use `bridge`), orch's rule
    for it is put first in every forward chain that does not let everything through and lacks
    it. Returns the changes that failed, each said with its command (the next call tries again;
    `orch check local` shows what is left). With `strict`, a rule that could not be put in
    place raises `ProviderError` instead: the nodes could not reach each other.
    """
    found = read_firewall(path)
    links = link_names()
    keep = links | {bridge} if wanted else links - {bridge}
    failed: list[str] = []

    def change(argv: list[str], *, must: bool) -> None:
        out = _run(argv)
        if out.returncode == 0:
            return
        said = f"`{' '.join(argv)}` failed: {out.stderr.strip()[:300]}"
        if must and strict:
            raise ProviderError(
                f"could not let the traffic of local bridge {bridge} through the host's "
                f"firewall: {said}",
                hint="accept it yourself (iptables -I FORWARD -i BRIDGE -o BRIDGE -j ACCEPT), "
                "or set ORCH_LOCAL_NETWORK=loopback; `orch check local` shows the firewall",
            )
        failed.append(said)

    for ipt, table in found.iptables:
        for rule, tagged in fw.ipt_tagged(table):
            if tagged not in keep:
                change(fw.ipt_delete_argv(ipt.binary, rule), must=False)
        if wanted and not fw.ipt_open(table) and not fw.ipt_allows(table, bridge):
            change(fw.ipt_insert_argv(ipt.binary, table, bridge), must=True)
    for chain in found.chains:
        if not chain.addressable:
            continue
        for rule, tagged in fw.nft_tagged(chain):
            if tagged not in keep:
                change([str(found.nft), *fw.nft_delete_argv(chain, rule)[1:]], must=False)
        if wanted and not fw.nft_open(chain) and not fw.nft_allows(chain, bridge):
            change([str(found.nft), *fw.nft_insert_argv(chain, bridge)[1:]], must=True)
    return failed
