"""The ingress of the default VPC's `orch` group: SSH per owner, added and expired, never
replaced. Pure.

Several people (or one person's laptop and controller host) launch into the one `orch` group of
an account's default VPC, each from their own address (`aws.ssh_cidr`). Every SSH rule orch adds
names its owner (the `orch-owner` label) and when it was added or last confirmed, in the rule's
description: `orch-ssh owner=alice at=2026-05-01T10:00:00Z`. On each launch (`ingress_plan`):

- the owner's rule for its address is added, unless the group admits that address already
  (EC2 keeps one rule per address and port, whoever added it); when older than
  `REFRESH_AFTER_S`, its time is set to now;
- the owner's rules for other addresses (the address it had before: a laptop that moved) are
  revoked once older than `SSH_RULE_TTL_S`, so a job still driven from there keeps its SSH for
  that long;
- another owner's rule is never revoked;
- SSH between members of the group is kept: the controller host, a member, reaches the nodes
  over their private addresses;
- anything else is revoked: the group is orch's (all traffic between members, a port opened
  by hand, an SSH rule that names no owner). Traffic between the nodes of one cluster goes
  through the cluster's own group (`cluster_network`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network
from typing import Any

SSH_RULE_TTL_S = 7 * 24 * 3600.0  # an owner's rule for an address it no longer launches from
REFRESH_AFTER_S = 24 * 3600.0  # a rule in use is confirmed (its time set to now) this often
_PREFIX = "orch-ssh"
# What EC2 takes in a rule description: a-z A-Z 0-9 space ._-:/()#,@[]+=&;{}!$*; the label
# keeps a smaller set and puts "_" for the rest.
_LABEL_OUT = re.compile(r"[^A-Za-z0-9._@+-]")
_DESCRIPTION = re.compile(
    rf"^{_PREFIX} owner=(?P<owner>[A-Za-z0-9._@+-]+) at=(?P<at>\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$"
)


def owner_label(owner: str) -> str:
    """`owner` as it is written into a rule description (64 characters at most). Pure."""
    return _LABEL_OUT.sub("_", owner)[:64] or "_"


def rule_description(owner: str, at: datetime) -> str:
    """The description of `owner`'s SSH rule, added or confirmed at `at`. Pure."""
    return f"{_PREFIX} owner={owner_label(owner)} at={at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def parse_description(text: str | None) -> tuple[str, datetime] | None:
    """(owner label, time) of an orch SSH rule's description; None for any other text. Pure."""
    found = _DESCRIPTION.match(text or "")
    if found is None:
        return None
    at = datetime.strptime(found.group("at"), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return found.group("owner"), at


def ssh_permission(cidr: str, description: str | None = None) -> dict[str, Any]:
    """TCP 22 from `cidr` (IPv4 or IPv6), as an `IpPermissions` entry. Pure."""
    v4 = ip_network(cidr).version == 4
    key, field_name = ("IpRanges", "CidrIp") if v4 else ("Ipv6Ranges", "CidrIpv6")
    source: dict[str, str] = {field_name: cidr}
    if description is not None:
        source["Description"] = description
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, key: [source]}


def members_ssh(group_id: str) -> dict[str, Any]:
    """TCP 22 from members of `group_id`. Pure."""
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
            "UserIdGroupPairs": [{"GroupId": group_id}]}  # fmt: skip


@dataclass(frozen=True)
class Single:
    """One ingress rule of one source, as DescribeSecurityGroups reports it."""

    permission: dict[str, Any]  # an `IpPermissions` entry of this source alone, no description
    cidr: str | None  # the address range (None: a group or prefix list)
    group: str | None  # the referenced group (None: an address range or prefix list)
    description: str | None

    @property
    def ssh(self) -> bool:
        p = self.permission
        return p["IpProtocol"] == "tcp" and p.get("FromPort") == 22 and p.get("ToPort") == 22


def singles(permissions: list[dict[str, Any]]) -> list[Single]:
    """Every rule of `permissions` (DescribeSecurityGroups' `IpPermissions`), one per source,
    each with its description apart. Pure."""
    out: list[Single] = []
    for p in permissions:
        base = {"IpProtocol": p["IpProtocol"]}
        if p["IpProtocol"] != "-1":
            base |= {k: p[k] for k in ("FromPort", "ToPort") if k in p}
        for r in p.get("IpRanges") or []:
            one = base | {"IpRanges": [{"CidrIp": r["CidrIp"]}]}
            out.append(Single(one, r["CidrIp"], None, r.get("Description")))
        for r in p.get("Ipv6Ranges") or []:
            one = base | {"Ipv6Ranges": [{"CidrIpv6": r["CidrIpv6"]}]}
            out.append(Single(one, r["CidrIpv6"], None, r.get("Description")))
        for pair in p.get("UserIdGroupPairs") or []:
            one = base | {"UserIdGroupPairs": [{"GroupId": pair["GroupId"]}]}
            out.append(Single(one, None, pair["GroupId"], pair.get("Description")))
        for prefix in p.get("PrefixListIds") or []:
            one = base | {"PrefixListIds": [{"PrefixListId": prefix["PrefixListId"]}]}
            out.append(Single(one, None, None, prefix.get("Description")))
    return out


@dataclass
class IngressPlan:
    """What one launch changes in the `orch` group: each entry one rule of one source."""

    revoke: list[dict[str, Any]] = field(default_factory=list)
    authorize: list[dict[str, Any]] = field(default_factory=list)
    refresh: list[dict[str, Any]] = field(default_factory=list)  # new descriptions

    @property
    def empty(self) -> bool:
        return not (self.revoke or self.authorize or self.refresh)


def ingress_plan(
    permissions: list[dict[str, Any]],
    group_id: str,
    *,
    owner: str,
    cidr: str,
    now: datetime,
    ttl_s: float = SSH_RULE_TTL_S,
    refresh_s: float = REFRESH_AFTER_S,
) -> IngressPlan:
    """The changes that give the `orch` group `group_id`, whose ingress is `permissions`,
    `owner`'s SSH from `cidr`, as the module docstring says. Pure."""
    me = owner_label(owner)
    plan = IngressPlan()
    members = admitted = False
    for rule in singles(permissions):
        if rule.ssh and rule.group == group_id:
            members = True
            continue
        parsed = parse_description(rule.description) if rule.ssh and rule.cidr else None
        if parsed is None:
            plan.revoke.append(rule.permission)
            continue
        label, at = parsed
        if rule.cidr == cidr:
            admitted = True
            if label == me and (now - at).total_seconds() >= refresh_s:
                plan.refresh.append(ssh_permission(cidr, rule_description(owner, now)))
        elif label == me and now - at >= timedelta(seconds=ttl_s):
            plan.revoke.append(rule.permission)
    if not members:
        plan.authorize.append(members_ssh(group_id))
    if not admitted:
        plan.authorize.append(ssh_permission(cidr, rule_description(owner, now)))
    return plan
