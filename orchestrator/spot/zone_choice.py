"""The zone-aware spot policies applied live (pure): what the provider says of each zone, as
the simulator's `ZoneInputs`, and the zones a launch is then asked to use.

The decision itself is the simulator's `MultiZonePolicy` (`orchestrator.spot.zones`); this
module only fits what a live controller knows to it, which is less than a trace tells:

- a provider may not say whether spot can be had in a zone (EC2 cannot before a launch
  tries): unknown counts as yes, except in a zone whose spot launch was just refused; spot
  nodes the job holds count as had in their zone;
- a zone without a fitting spot offer has no spot, and spot at or above on-demand is never
  taken (`ZoneInputs.spot_zone`);
- the job's checkpoint is in the zone it last ran in; a start in another zone costs the
  measured restart overhead too, since the checkpoint reaches the new nodes from the
  controller's mirror or the checkpoint store whichever zone they are in.

A provider without zones is one zone, named None: the policy then decides as its single-zone
base would, with the same restart.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal

from orchestrator.providers.base import ZoneMarket
from orchestrator.spot.inputs import Work
from orchestrator.spot.policies import Decision, Running
from orchestrator.spot.zones import ZoneInputs

__all__ = ["ZoneReading", "launch_zones", "read_zones"]


@dataclass(frozen=True)
class ZoneReading:
    """What the driver knows of each zone at one decision point."""

    zones: tuple[str | None, ...]  # zone names, in the provider's order; (None,): no zones
    spot: tuple[bool, ...]  # per zone: spot for all the job's nodes counts as available
    spot_prices: tuple[Decimal, ...]  # per zone, USD per node-hour (on-demand's where none)
    on_demand_price: Decimal  # USD per node-hour, the cheapest zone's

    @classmethod
    def single(cls, *, spot: bool, spot_price: Decimal, on_demand_price: Decimal) -> ZoneReading:
        """One zone without a name: a provider that has no zones."""
        return cls((None,), (spot,), (spot_price,), on_demand_price)

    def index(self, zone: str | None) -> int | None:
        """Position of `zone` (None when the reading has no such zone)."""
        try:
            return self.zones.index(zone)
        except ValueError:
            return None

    def inputs(
        self,
        *,
        work: Work | None,
        time_left_s: float,
        total_time_s: float,
        overhead_s: float,
        running: Running,
        checkpoint: str | None,
        decision_interval_s: float,
        spent_usd: Decimal | None,
    ) -> ZoneInputs:
        """The policy's inputs; `work` None (not measured yet) gives inputs fit only for
        `ZoneInputs.spot_zone` and `home`. A checkpoint in a zone the reading lacks (no longer
        offered) counts as none: every zone is then a move."""
        return ZoneInputs(
            work_left_s=0.0 if work is None else work.left_s,
            time_left_s=time_left_s,
            total_work_s=0.0 if work is None else work.total_s,
            total_time_s=total_time_s,
            overhead_s=overhead_s,
            migration_s=overhead_s,
            spot=self.spot,
            spot_prices=self.spot_prices,
            on_demand_price=self.on_demand_price,
            running=running,
            checkpoint=self.index(checkpoint),
            decision_interval_s=decision_interval_s,
            spent_usd=spent_usd,
        )

    def describe(self) -> str:
        """Which zones have spot, for the events: "spot in us-east-1b ($0.3300/h), none in
        us-east-1a"; "spot available" or "spot unavailable" without zones."""
        if self.zones == (None,):
            return f"spot {'available' if self.spot[0] else 'unavailable'}"
        have = [
            f"{zone} (${price:.4f}/h)"
            for zone, up, price in zip(self.zones, self.spot, self.spot_prices, strict=True)
            if up
        ]
        lack = [zone or "" for zone, up in zip(self.zones, self.spot, strict=True) if not up]
        text = f"spot in {', '.join(have)}" if have else "spot in no zone"
        return text + (f", none in {', '.join(lack)}" if have and lack else "")


def read_zones(
    markets: Sequence[ZoneMarket],
    *,
    refused: Collection[str],
    holding: str | None,
    default_prices: tuple[Decimal, Decimal],
) -> ZoneReading:
    """`markets` (the provider's answer, one per zone) as a reading: spot unknown counts as
    available, except in `refused` zones (a spot launch there was just refused); the zone the
    job holds spot nodes in (`holding`) has spot. On-demand is the cheapest zone's price.
    `default_prices` (spot, on-demand) stand for prices no zone knows; no market at all is one
    zone without a name and without spot."""
    spot_default, on_demand_default = default_prices
    if not markets:
        return ZoneReading.single(
            spot=False, spot_price=on_demand_default, on_demand_price=on_demand_default
        )
    known = [m.on_demand_price for m in markets if m.on_demand_price is not None]
    if known:
        on_demand = min(known)
    else:
        spots = [m.spot_price for m in markets if m.spot_price is not None]
        on_demand = min(spots) / spot_default * on_demand_default if spots else on_demand_default
    spot = tuple(
        m.zone == holding
        or (m.spot_price is not None and m.spot_available is not False and m.zone not in refused)
        for m in markets
    )
    prices = tuple(on_demand if m.spot_price is None else m.spot_price for m in markets)
    return ZoneReading(tuple(m.zone for m in markets), spot, prices, on_demand)


def launch_zones(
    reading: ZoneReading | None, decision: Decision, zone: str | None
) -> tuple[str, ...] | None:
    """The zones a launch on `decision` in `zone` may use, in order: spot in the chosen zone
    only (a refusal comes back to the policy, which may choose another); on-demand in the
    chosen zone first, then the reading's others (on-demand costs the same in each). None:
    no zone to ask for (the spec's zones hold)."""
    if zone is None or decision is Decision.WAIT:
        return None
    if decision is Decision.SPOT or reading is None:
        return (zone,)
    others = tuple(z for z in reading.zones if z is not None and z != zone)
    return (zone, *others)
