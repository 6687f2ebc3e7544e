"""Pure text of the rules that let a local bridge's traffic through the host's firewall.

Traffic between two namespace nodes is bridged: it crosses the host's bridge without being
routed. Once br_netfilter is loaded with `net.bridge.bridge-nf-call-iptables=1` (Docker's daemon
loads it at start, and sets iptables' FORWARD policy to DROP), bridged IPv4 traffic also goes
through netfilter's forward hook, where a dropping chain cuts the nodes off from each other
while SSH from the host (not forwarded) still works.

orch then accepts its own bridge's traffic explicitly: traffic that enters and leaves the
bridge (from one node to another), nothing else. Each rule carries the comment
`orch-bridge:<bridge>` (`tag`), by which orch finds exactly its own rules and the bridge they
belong to. Where the rule goes:

- iptables, over nf_tables (`iptables-nft`) or legacy (`iptables-legacy`): first in
  DOCKER-USER when that chain exists (Docker jumps to it first from FORWARD and never flushes
  it), else first in FORWARD;
- nftables used directly (`nft`): first in every base chain of family ip or inet hooked at
  forward, except the tables that iptables-nft manages (the iptables rule covers those).

A chain that lets everything through (policy accept, no rule) gets no rule: a host without a
firewall is left as it is. This module parses what those programs print and builds their
argv; `firewall_host` runs them.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

TAG_PREFIX = "orch-bridge:"
DOCKER_USER = "DOCKER-USER"
FORWARD = "FORWARD"
# The tables iptables-nft makes in family ip: nft leaves them to it.
XTABLES_TABLES = frozenset({"filter", "nat", "mangle", "raw", "security"})
NFT_FAMILIES = ("ip", "inet")  # the families whose forward hook sees bridged IPv4 traffic
_WAIT = ("-w", "5")  # legacy iptables: wait up to 5 s for the xtables lock another program holds

_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")
# Names nft's parser takes as plain identifiers; a chain named otherwise is left alone.
_NFT_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


def tag(bridge: str) -> str:
    """The comment of orch's rules for `bridge` (an interface name; ValueError otherwise)."""
    if not _IFNAME_RE.match(bridge):
        raise ValueError(f"{bridge!r} is not an interface name")
    return TAG_PREFIX + bridge


def bridge_of(comment: str | None) -> str | None:
    """The bridge a rule's comment names, when the comment is one of orch's tags."""
    if comment is None or not comment.startswith(TAG_PREFIX):
        return None
    bridge = comment.removeprefix(TAG_PREFIX)
    return bridge if _IFNAME_RE.match(bridge) else None


# --- iptables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IptRule:
    """One `-A CHAIN ...` line of `iptables -S`: its chain and the arguments after it."""

    chain: str
    args: tuple[str, ...]

    @property
    def comment(self) -> str | None:
        for i, arg in enumerate(self.args[:-1]):
            if arg == "--comment":
                return self.args[i + 1]
        return None

    @property
    def verdict(self) -> str | None:
        """The target of a rule that matches everything (`-j DROP` alone), else None."""
        if len(self.args) >= 2 and self.args[0] == "-j":
            return self.args[1]
        return None


@dataclass(frozen=True)
class IptTable:
    """The filter table as `iptables -S` prints it."""

    policies: dict[str, str]  # built-in chain -> ACCEPT or DROP
    chains: frozenset[str]  # the user-defined chains
    rules: tuple[IptRule, ...]


def parse_iptables_s(text: str) -> IptTable:
    """Parse `iptables -t filter -S`; lines it cannot read are skipped."""
    policies: dict[str, str] = {}
    chains: set[str] = set()
    rules: list[IptRule] = []
    for line in text.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if len(words) == 3 and words[0] == "-P":
            policies[words[1]] = words[2]
        elif len(words) == 2 and words[0] == "-N":
            chains.add(words[1])
        elif len(words) >= 2 and words[0] == "-A":
            rules.append(IptRule(words[1], tuple(words[2:])))
    return IptTable(policies, frozenset(chains), tuple(rules))


def ipt_drops(table: IptTable) -> str:
    """What in FORWARD drops traffic that no earlier rule accepts ("" when nothing does)."""
    if table.policies.get(FORWARD, "ACCEPT") != "ACCEPT":
        return f"policy {table.policies[FORWARD]}"
    for rule in table.rules:
        if rule.chain == FORWARD and rule.verdict in ("DROP", "REJECT"):
            return f"a rule `-A FORWARD {shlex.join(rule.args)}`"
    return ""


def ipt_open(table: IptTable) -> bool:
    """Whether FORWARD lets everything through: policy ACCEPT and no rule but orch's."""
    return table.policies.get(FORWARD, "ACCEPT") == "ACCEPT" and not any(
        rule.chain == FORWARD and bridge_of(rule.comment) is None for rule in table.rules
    )


class _Commented(Protocol):
    @property
    def comment(self) -> str | None: ...


R = TypeVar("R", bound=_Commented)


def tagged_rules(rules: Iterable[R]) -> list[tuple[R, str]]:
    """orch's rules among `rules`, each with the bridge it is for."""
    return [(rule, bridge) for rule in rules if (bridge := bridge_of(rule.comment)) is not None]


def ipt_tagged(table: IptTable) -> list[tuple[IptRule, str]]:
    """orch's rules in the table, each with the bridge it is for."""
    return tagged_rules(table.rules)


def ipt_allows(table: IptTable, bridge: str) -> bool:
    """Whether orch's rule for `bridge` is in the table (in whichever chain)."""
    return any(tagged == bridge for _, tagged in ipt_tagged(table))


def ipt_allow_chain(table: IptTable) -> str:
    """Where orch's rule goes: DOCKER-USER when the table has it, else FORWARD."""
    return DOCKER_USER if DOCKER_USER in table.chains else FORWARD


def ipt_allow_args(bridge: str) -> list[str]:
    """The rule's match and target: bridged from the bridge to the bridge, tagged, ACCEPT."""
    return ["-i", bridge, "-o", bridge, "-m", "comment", "--comment", tag(bridge), "-j", "ACCEPT"]


def ipt_insert_argv(binary: str, table: IptTable, bridge: str) -> list[str]:
    """Insert orch's rule for `bridge` first in its chain."""
    chain = ipt_allow_chain(table)
    return [binary, *_WAIT, "-t", "filter", "-I", chain, "1", *ipt_allow_args(bridge)]


def ipt_delete_argv(binary: str, rule: IptRule) -> list[str]:
    """Delete `rule` by its exact specification, as `iptables -S` printed it."""
    return [binary, *_WAIT, "-t", "filter", "-D", rule.chain, *rule.args]


def ipt_list_argv(binary: str) -> list[str]:
    """List the filter table's chains and rules."""
    return [binary, *_WAIT, "-t", "filter", "-S"]


# --- nftables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NftRule:
    handle: int
    comment: str | None
    verdict: str | None  # "drop" or "reject" for a rule that is only that verdict


@dataclass(frozen=True)
class NftChain:
    """A base chain hooked at forward, with its rules."""

    family: str
    table: str
    name: str
    policy: str  # accept or drop
    rules: tuple[NftRule, ...]

    @property
    def where(self) -> str:
        return f"nft {self.family} {self.table} {self.name}"

    @property
    def addressable(self) -> bool:
        """Whether its names can be written on nft's command line as they are."""
        return all(_NFT_NAME_RE.match(name) for name in (self.table, self.name))


def parse_nft_json(text: str) -> list[NftChain]:
    """The forward base chains of families ip and inet in `nft -j list ruleset`."""
    try:
        items = json.loads(text or "{}").get("nftables", [])
    except (ValueError, AttributeError, RecursionError):
        return []
    if not isinstance(items, list):
        return []
    heads: dict[tuple[str, str, str], str] = {}
    rules: dict[tuple[str, str, str], list[NftRule]] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        chain, rule = item.get("chain"), item.get("rule")
        if isinstance(chain, dict) and chain.get("hook") == "forward":
            if chain.get("family") in NFT_FAMILIES:
                key = (str(chain.get("family")), str(chain.get("table")), str(chain.get("name")))
                heads[key] = str(chain.get("policy", "accept"))
        elif isinstance(rule, dict):
            key = (str(rule.get("family")), str(rule.get("table")), str(rule.get("chain")))
            parsed = _nft_rule(rule)
            if parsed is not None:
                rules.setdefault(key, []).append(parsed)
    return [
        NftChain(family, table, name, policy, tuple(rules.get((family, table, name), [])))
        for (family, table, name), policy in heads.items()
    ]


def _nft_rule(rule: dict) -> NftRule | None:
    handle = rule.get("handle")
    if not isinstance(handle, int):
        return None
    comment = rule.get("comment")
    expr = rule.get("expr")
    verdict = None
    if isinstance(expr, list):
        kinds = [next(iter(e)) for e in expr if isinstance(e, dict) and e]
        kinds = [k for k in kinds if k != "counter"]
        if kinds in (["drop"], ["reject"]):
            verdict = kinds[0]
    return NftRule(handle, comment if isinstance(comment, str) else None, verdict)


def nft_drops(chain: NftChain) -> str:
    """What in the chain drops traffic that no earlier rule accepts ("" when nothing does)."""
    if chain.policy != "accept":
        return f"policy {chain.policy}"
    for rule in chain.rules:
        if rule.verdict is not None:
            return f"a `{rule.verdict}` rule"
    return ""


def nft_open(chain: NftChain) -> bool:
    """Whether the chain lets everything through: policy accept and no rule but orch's."""
    return chain.policy == "accept" and all(bridge_of(r.comment) for r in chain.rules)


def nft_tagged(chain: NftChain) -> list[tuple[NftRule, str]]:
    """orch's rules in the chain, each with the bridge it is for."""
    return tagged_rules(chain.rules)


def nft_allows(chain: NftChain, bridge: str) -> bool:
    return any(tagged == bridge for _, tagged in nft_tagged(chain))


def nft_native(chains: Iterable[NftChain], *, iptables_nft: bool) -> list[NftChain]:
    """The chains orch handles with nft: all of them, less the iptables-nft tables when
    iptables-nft reads them (its own rule covers those)."""
    return [
        chain
        for chain in chains
        if not (iptables_nft and chain.family == "ip" and chain.table in XTABLES_TABLES)
    ]


def nft_insert_argv(chain: NftChain, bridge: str) -> list[str]:
    """Insert orch's rule for `bridge` first in `chain`."""
    return [
        "nft", "insert", "rule", chain.family, chain.table, chain.name,
        "iifname", f'"{bridge}"', "oifname", f'"{bridge}"', "accept", "comment", f'"{tag(bridge)}"',
    ]  # fmt: skip


def nft_delete_argv(chain: NftChain, rule: NftRule) -> list[str]:
    """Delete `rule` of `chain` by its handle."""
    return ["nft", "delete", "rule", chain.family, chain.table, chain.name, "handle",
            str(rule.handle)]  # fmt: skip


NFT_LIST_ARGV = ["nft", "-j", "list", "ruleset"]


# --- what `orch check` says ---------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One chain of the host's firewall that bridged traffic between nodes passes."""

    where: str  # "iptables-nft FORWARD", "nft inet filter forward"
    drops: str  # what drops there what no earlier rule accepts ("" when nothing does)
    allowed: bool  # orch's rule for the bridge is there
    managed: bool = True  # orch can put its rule there
    unread: str = ""  # why it could not be read ("" when it was)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str
    fix: str = ""
    needed: bool = True  # False: only a note (orch could not tell)


def forward_verdict(
    bridge: str,
    bridge_nf: str | None,
    findings: list[Finding],
    *,
    in_use: bool,
    stale: list[str],
) -> Verdict:
    """Whether traffic between nodes on `bridge` gets through the host's firewall, and why.

    `bridge_nf`: `net.bridge.bridge-nf-call-iptables` (None: br_netfilter is not loaded);
    `in_use`: nodes are attached to the bridge now; `stale`: orch's rules left for bridges that
    no longer exist (a crash left them). A chain that drops and that orch cannot change, or
    running nodes without orch's rule, is not ready; a chain orch could not read is a note.
    """
    left = (
        f"; orch's rules for gone bridges remain ({', '.join(stale)}): the next local launch "
        "or `orch reconcile` removes them"
        if stale
        else ""
    )
    if bridge_nf is None or bridge_nf.strip() != "1":
        why = (
            "br_netfilter is not loaded"
            if bridge_nf is None
            else f"net.bridge.bridge-nf-call-iptables={bridge_nf.strip()}"
        )
        return Verdict(True, f"{why}: traffic between nodes on {bridge} skips iptables{left}")
    through = f"net.bridge.bridge-nf-call-iptables=1: traffic between nodes on {bridge} goes"
    dropping = [f for f in findings if f.drops]
    said = "; ".join(f"{f.where}: {f.drops}" for f in dropping)
    unread = [f for f in findings if f.unread]
    if blocked := [f for f in dropping if not f.managed]:
        return Verdict(
            False,
            f"{through} through chains that drop it ({said}), and orch cannot add its rule to "
            f"{', '.join(f.where for f in blocked)}{left}",
            f"accept the bridge's traffic there yourself (iptables -I FORWARD -i {bridge} -o "
            f"{bridge} -j ACCEPT), or set ORCH_LOCAL_NETWORK=loopback",
        )
    if in_use and (missing := [f for f in dropping if not f.allowed]):
        return Verdict(
            False,
            f"{through} through chains that drop it ({said}); nodes run on {bridge} but orch's "
            f"rule is not in {', '.join(f.where for f in missing)} (the firewall changed after "
            f"they started): they cannot reach each other{left}",
            "run `orch reconcile`: it puts the rule back for running nodes",
        )
    if unread:
        return Verdict(
            False,
            f"{through} through the forward hook, and orch cannot read "
            + "; ".join(f"{f.where} ({f.unread})" for f in unread)
            + ": should it drop forwarded traffic, nodes could not reach each other"
            + left,
            "install iptables (apt-get install iptables), which lets orch read it and add its "
            "rule where needed",
            needed=False,
        )
    if not dropping:
        where = ", ".join(f.where for f in findings) or "no iptables or nft chain here"
        return Verdict(True, f"{through} through the forward hook, where nothing drops it "
                       f"({where}){left}")  # fmt: skip
    state = "in place now" if in_use else "added when nodes start"
    return Verdict(
        True,
        f"{through} through chains that drop it ({said}): orch accepts it with a rule of its "
        f"own, comment {tag(bridge)} ({state}), removed with the bridge's last node{left}",
    )
