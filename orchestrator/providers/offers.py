"""Offers: what can be launched where, at what price, cheapest first.

An `Offer` is one instance type in one availability zone on one market (spot or on-demand).
`rank_offers` is pure: catalog + wanted resources + zones + spot prices -> ranked offers.
`SpotPriceSource` is the I/O part: it asks EC2 which zones sell a type and what spot costs there
(newest price per zone), and caches the answers for a few minutes.

Rules (the issue's contract):
- on-demand offers: every zone of a region that sells the type, at the catalog's list price;
- spot offers: a zone whose newest spot price is known AND below on-demand; a zone without a
  price, or with one at or above on-demand, is no spot offer;
- `spot`: True -> spot offers only, False -> on-demand only, "auto" -> both;
- filters: accelerator (any when None), at least `gpus_per_node` GPUs, at least
  `min_gpu_memory_gb` per GPU, price at most `max_price_per_hour`, only the listed
  `instance_types` and `zones` when the spec lists them;
- order: a listed instance type before the ones listed after it (the spec's preference, at
  any price), then price, then on-demand before spot at an equal price, then fewer GPUs, then the
  cheaper on-demand type, then the order of `regions`, then zone name, then type name (so
  equal inputs always rank the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from orchestrator.providers.aws.catalog import Catalog
from orchestrator.providers.base import LaunchRequest, Market, MarketPrices, ZoneMarket

SpotPrices = Mapping[tuple[str, str, str], Decimal]  # (region, zone, type) -> USD per hour
TypeZones = Mapping[tuple[str, str], Sequence[str]]  # (region, type) -> zones that sell it

_MARKET_ORDER = {"on-demand": 0, "spot": 1}


@dataclass(frozen=True)
class OfferQuery:
    """What a node must have, and which markets and prices are acceptable."""

    gpus_per_node: int = 1  # least GPUs per instance
    accelerator: str | None = None  # GPU model (case-insensitive); None: any
    min_gpu_memory_gb: float | None = None  # least memory per GPU (GiB as AWS lists it)
    spot: bool | Literal["auto"] = False  # True: spot only; False: on-demand only; "auto": both
    max_price_per_hour: Decimal | None = None  # per node; offers above it are dropped
    instance_types: tuple[str, ...] = ()  # only these, the earlier preferred at any price
    zones: tuple[str, ...] = ()  # only these availability zones (): any

    @classmethod
    def from_resources(cls, resources: Any) -> OfferQuery:
        """Build from anything shaped like `spec.Resources` or `LaunchRequest` (same names)."""
        return cls(
            gpus_per_node=resources.gpus_per_node,
            accelerator=resources.accelerator,
            min_gpu_memory_gb=getattr(resources, "min_gpu_memory_gb", None),
            spot=resources.spot,
            max_price_per_hour=resources.max_price_per_hour,
            instance_types=tuple(getattr(resources, "instance_types", ())),
            zones=tuple(getattr(resources, "zones", ())),
        )

    @property
    def markets(self) -> tuple[Market, ...]:
        if self.spot == "auto":
            return ("on-demand", "spot")
        return ("spot",) if self.spot is True else ("on-demand",)


@dataclass(frozen=True)
class Offer:
    """One launchable choice: a type, in one zone, on one market, at one price."""

    instance_type: str  # e.g. "g5.xlarge"
    region: str  # e.g. "us-east-1"
    zone: str  # availability zone, e.g. "us-east-1a"; all nodes of a launch go to one zone
    market: Market  # "spot" or "on-demand"
    price_per_hour: Decimal  # USD per node-hour: the spot price, or the on-demand list price
    on_demand_price: Decimal  # the type's on-demand list price in the region (for comparison)
    gpu: str  # GPU model
    gpus: int  # GPUs per node
    gpu_memory_gib: float  # memory of one GPU
    vcpus: int
    memory_gib: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; prices as exact decimal strings."""
        return {
            "instance_type": self.instance_type,
            "region": self.region,
            "zone": self.zone,
            "market": self.market,
            "price_per_hour": str(self.price_per_hour),
            "on_demand_price": str(self.on_demand_price),
            "gpu": self.gpu,
            "gpus": self.gpus,
            "gpu_memory_gib": self.gpu_memory_gib,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
        }


def rank_offers(
    catalog: Catalog,
    query: OfferQuery,
    *,
    regions: Sequence[str],
    zones: TypeZones,
    spot_prices: SpotPrices,
) -> list[Offer]:
    """Every offer that fits `query`, cheapest first (see the module docstring). Pure."""
    offers: list[Offer] = []
    for region in regions:
        for itype in catalog.query(
            accelerator=query.accelerator,
            gpus=query.gpus_per_node,
            min_gpu_memory_gb=query.min_gpu_memory_gb,
            region=region,
        ):
            if query.instance_types and itype.name not in query.instance_types:
                continue
            on_demand = itype.on_demand[region]
            for zone in sorted(set(zones.get((region, itype.name), ()))):
                if query.zones and zone not in query.zones:
                    continue
                for market in query.markets:
                    if market == "on-demand":
                        price: Decimal | None = on_demand
                    else:
                        price = spot_prices.get((region, zone, itype.name))
                        if price is None or price >= on_demand:
                            continue
                    if query.max_price_per_hour is not None and price > query.max_price_per_hour:
                        continue
                    offers.append(
                        Offer(
                            instance_type=itype.name,
                            region=region,
                            zone=zone,
                            market=market,
                            price_per_hour=price,
                            on_demand_price=on_demand,
                            gpu=itype.gpu,
                            gpus=itype.gpus,
                            gpu_memory_gib=itype.gpu_memory_gib,
                            vcpus=itype.vcpus,
                            memory_gib=itype.memory_gib,
                        )
                    )
    region_order = {r: i for i, r in enumerate(regions)}
    preference = {name: i for i, name in enumerate(query.instance_types)}
    offers.sort(
        key=lambda o: (
            preference.get(o.instance_type, 0),  # a listed type before any later one
            o.price_per_hour,
            _MARKET_ORDER[o.market],
            o.gpus,
            o.on_demand_price,
            region_order[o.region],
            o.zone,
            o.instance_type,
        )
    )
    return offers


def cheapest_prices(offers: Iterable[Offer]) -> MarketPrices:
    """The lowest price per node-hour on each market among `offers` (None: no such offer)."""
    best: dict[str, Decimal] = {}
    for offer in offers:
        if offer.market not in best or offer.price_per_hour < best[offer.market]:
            best[offer.market] = offer.price_per_hour
    return MarketPrices(spot=best.get("spot"), on_demand=best.get("on-demand"))


def launch_order(offers: Sequence[Offer], request: LaunchRequest) -> list[Offer]:
    """The order `launch` tries `offers` (ranked by `rank_offers`) in for `request`: with
    `zones_ordered`, the zones' order first (a zone-aware spot policy's choice); zones in
    `avoid_zones` (where the job was just interrupted) last. Stable: the price ranking holds
    within each group. Pure."""
    place = {zone: i for i, zone in enumerate(request.zones)} if request.zones_ordered else {}
    return sorted(
        offers, key=lambda o: (o.zone in request.avoid_zones, place.get(o.zone, len(place)))
    )


def zone_markets(offers: Iterable[Offer]) -> tuple[ZoneMarket, ...]:
    """Per zone of `offers`, the cheapest price on each market, by zone name. Whether spot
    can be had is unknown (None) where a spot offer fits, False where none does. Pure."""
    prices: dict[str, dict[str, Decimal]] = {}
    for offer in offers:
        best = prices.setdefault(offer.zone, {})
        if offer.market not in best or offer.price_per_hour < best[offer.market]:
            best[offer.market] = offer.price_per_hour
    return tuple(
        ZoneMarket(
            zone=zone,
            spot_available=None if "spot" in best else False,
            spot_price=best.get("spot"),
            on_demand_price=best.get("on-demand"),
        )
        for zone, best in sorted(prices.items())
    )


def newest_spot_prices(region: str, history: Iterable[Mapping[str, Any]]) -> dict:
    """From `describe_spot_price_history` records, the newest price per (zone, type). Pure.

    Returns {(region, zone, type): Decimal}. Records without a price or zone are skipped.
    """
    newest: dict[tuple[str, str, str], tuple[datetime, Decimal]] = {}
    epoch = datetime.min.replace(tzinfo=UTC)
    for rec in history:
        zone, itype = rec.get("AvailabilityZone"), rec.get("InstanceType")
        price = rec.get("SpotPrice")
        if not zone or not itype or price in (None, ""):
            continue
        stamp = rec.get("Timestamp") or epoch
        if isinstance(stamp, datetime) and stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        key = (region, zone, itype)
        if key not in newest or stamp > newest[key][0]:
            newest[key] = (stamp, Decimal(str(price)))
    return {key: price for key, (_, price) in newest.items()}


class SpotPriceSource:
    """EC2's zones-per-type and current spot prices, cached for `ttl_s` seconds per query.

    `client_for(region)` returns a boto3 EC2 client of that region; it is called only when a
    query is not cached (no I/O at construction). Prices are Linux/UNIX, newest per zone.
    """

    def __init__(
        self,
        client_for: Callable[[str], Any],
        *,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client_for = client_for
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[tuple[str, str, frozenset[str]], tuple[float, dict]] = {}

    def _cached(self, key: tuple[str, str, frozenset[str]], fetch: Callable[[], dict]) -> dict:
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._ttl_s:
            return hit[1]
        value = fetch()
        self._cache[key] = (now, value)
        return value

    def _records(self, region: str, operation: str, key: str, **params: Any) -> Iterator[dict]:
        """Every record of a paginated EC2 call, across its pages."""
        pages = self._client_for(region).get_paginator(operation).paginate(**params)
        for page in pages:
            yield from page.get(key, [])

    def spot_prices(self, region: str, instance_types: Iterable[str]) -> dict:
        """{(region, zone, type): Decimal} for the types, newest price per zone (paginated)."""
        types = frozenset(instance_types)
        if not types:
            return {}

        def fetch() -> dict:
            records = self._records(
                region,
                "describe_spot_price_history",
                "SpotPriceHistory",
                InstanceTypes=sorted(types),
                ProductDescriptions=["Linux/UNIX"],
                StartTime=datetime.now(UTC),
            )
            return newest_spot_prices(region, records)

        return self._cached(("spot", region, types), fetch)

    def zones(self, region: str, instance_types: Iterable[str]) -> dict:
        """{(region, type): [zone, ...]}: the zones of `region` that sell each type."""
        types = frozenset(instance_types)
        if not types:
            return {}

        def fetch() -> dict:
            found: dict[tuple[str, str], list[str]] = {}
            for rec in self._records(
                region,
                "describe_instance_type_offerings",
                "InstanceTypeOfferings",
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": sorted(types)}],
            ):
                found.setdefault((region, rec["InstanceType"]), []).append(rec["Location"])
            return {key: sorted(set(zs)) for key, zs in found.items()}

        return self._cached(("zones", region, types), fetch)


def collect_offers(
    catalog: Catalog, query: OfferQuery, *, regions: Sequence[str], source: SpotPriceSource
) -> list[Offer]:
    """Ask `source` about the catalog types that could fit, then `rank_offers`. Does I/O."""
    zones: dict[tuple[str, str], list[str]] = {}
    prices: dict[tuple[str, str, str], Decimal] = {}
    for region in regions:
        names = [
            t.name
            for t in catalog.query(
                accelerator=query.accelerator,
                gpus=query.gpus_per_node,
                min_gpu_memory_gb=query.min_gpu_memory_gb,
                region=region,
            )
            if not query.instance_types or t.name in query.instance_types
        ]
        zones.update(source.zones(region, names))
        if "spot" in query.markets:
            prices.update(source.spot_prices(region, names))
    return rank_offers(catalog, query, regions=regions, zones=zones, spot_prices=prices)
