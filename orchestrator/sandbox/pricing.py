"""The sandbox's price table: what each catalog type costs in each of its zones. Pure.

Every type of orch's catalog that is sold in the sandbox's region is sold in every sandbox zone,
on demand at the catalog's list price, and on spot at a fixed share of it that grows with the
zone's position: 30 % in the first zone, 33 % in the second, 36 % in the third and so on, rounded
to 4 decimals. So the first zone is always the cheapest spot offer, and failing over to the next
one is visible in the price a node was launched at.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from orchestrator.providers.aws.catalog import Catalog

FIRST_ZONE_SPOT_SHARE = Decimal("0.30")
SPOT_SHARE_STEP = Decimal("0.03")  # added per zone after the first
PRICE_QUANTUM = Decimal("0.0001")
MARKETS = ("spot", "on-demand")


def spot_share(zone_index: int) -> Decimal:
    """Spot price / on-demand price in the zone at `zone_index` (0-based)."""
    return FIRST_ZONE_SPOT_SHARE + SPOT_SHARE_STEP * zone_index


@dataclass(frozen=True)
class PriceTable:
    """Prices of one region's zones, USD per instance-hour."""

    region: str
    zones: tuple[str, ...]
    on_demand: Mapping[str, Decimal]  # instance type -> list price (every zone)
    spot: Mapping[tuple[str, str], Decimal]  # (zone, instance type) -> current spot price

    def sells(self, zone: str, instance_type: str) -> bool:
        return zone in self.zones and instance_type in self.on_demand

    def price(self, zone: str, instance_type: str, market: str) -> Decimal | None:
        """The price of `instance_type` in `zone` on `market`; None when not sold there."""
        if not self.sells(zone, instance_type):
            return None
        if market == "spot":
            return self.spot[(zone, instance_type)]
        return self.on_demand[instance_type]

    def offerings(self) -> Iterator[tuple[str, str]]:
        """(instance type, zone) of every offering, ordered by type then zone."""
        for itype in sorted(self.on_demand):
            for zone in self.zones:
                yield itype, zone

    def rows(self) -> list[dict[str, str]]:
        """JSON-ready rows: zone, instance type, spot and on-demand price (exact decimals)."""
        return [
            {
                "zone": zone,
                "instance_type": itype,
                "spot": str(self.spot[(zone, itype)]),
                "on_demand": str(self.on_demand[itype]),
            }
            for itype, zone in self.offerings()
        ]


def price_table(catalog: Catalog, region: str, zones: Sequence[str]) -> PriceTable:
    """The table of the catalog's types sold in `region`, for `zones` in that order."""
    on_demand = {t.name: price for t in catalog.types if (price := t.price_in(region)) is not None}
    spot = {
        (zone, name): (price * spot_share(index)).quantize(PRICE_QUANTUM)
        for index, zone in enumerate(zones)
        for name, price in on_demand.items()
    }
    return PriceTable(region=region, zones=tuple(zones), on_demand=on_demand, spot=spot)
