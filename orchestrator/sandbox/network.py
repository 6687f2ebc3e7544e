"""The sandbox's network plan: its VPC range, host bridge, and one subnet per zone. Pure.

The VPC range lies on a host bridge of the sandbox's own (not the local provider's `orchbr0` /
10.213.0.0/24): the bridge holds the range's first address, and zone i (0-based) gets the
subnet `10.214.(i+1).0/24`. Hosts put their private IP on `ens5` with the VPC's prefix length, so
any two hosts reach each other over the bridge, and the bridge is their default gateway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

DEFAULT_CIDR = IPv4Network("10.214.0.0/16")
DEFAULT_BRIDGE = "orchsbx0"
SUBNET_PREFIX = 24


@dataclass(frozen=True)
class SandboxNetwork:
    """Where the sandbox's hosts live on this machine."""

    cidr: IPv4Network = DEFAULT_CIDR  # the VPC's range
    bridge: str = DEFAULT_BRIDGE  # host bridge every host's veth is attached to

    @property
    def gateway(self) -> IPv4Address:
        """The bridge's address: the first host address of the range."""
        return next(self.cidr.hosts())

    @property
    def bridge_cidr(self) -> str:
        return f"{self.gateway}/{self.cidr.prefixlen}"

    def subnets(self, zones: Sequence[str]) -> dict[str, IPv4Network]:
        """{zone: subnet}: the (i+1)-th /24 of the range for the i-th zone (never the bridge's)."""
        blocks = self.cidr.subnets(new_prefix=SUBNET_PREFIX)
        next(blocks)  # the first block holds the bridge address
        plan: dict[str, IPv4Network] = {}
        for zone in zones:
            try:
                plan[zone] = next(blocks)
            except StopIteration:
                raise ValueError(f"{self.cidr} has no room for {len(zones)} subnets") from None
        return plan

    def holds(self, ip: str) -> bool:
        """Whether `ip` is an address of the range other than the bridge's."""
        try:
            address = IPv4Address(ip)
        except ValueError:
            return False
        special = (self.cidr.network_address, self.cidr.broadcast_address, self.gateway)
        return address in self.cidr and address not in special
