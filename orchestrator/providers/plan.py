"""Pure: what a submit would launch and what it may cost (`orch submit --dry-run`).

Each provider's `plan(request, budget)` builds its `DryRun` from these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.offers import Offer
from orchestrator.spec.model import Budget


@dataclass(frozen=True)
class LaunchPlan:
    provider: str
    nodes: int
    gpus_per_node: int
    market: str  # spot | on-demand
    instance_type: str
    price_per_node_hour: Decimal  # USD
    max_runtime_s: float | None
    max_cost_usd: Decimal | None
    zone: str | None = None  # where the first try goes (None: the provider has no zones)
    notes: tuple[str, ...] = ()  # what else the plan means (ports opened, fields ignored)

    @property
    def hourly_usd(self) -> Decimal:
        return self.price_per_node_hour * self.nodes

    @property
    def cost_at_max_runtime(self) -> Decimal | None:
        if self.max_runtime_s is None:
            return None
        return self.hourly_usd * Decimal(str(self.max_runtime_s)) / Decimal(3600)

    def as_dict(self) -> dict:
        cost = self.cost_at_max_runtime
        return {
            "provider": self.provider,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "market": self.market,
            "instance_type": self.instance_type,
            "price_per_node_hour": float(self.price_per_node_hour),
            "hourly_usd": float(self.hourly_usd),
            "max_runtime_s": self.max_runtime_s,
            "cost_at_max_runtime_usd": None if cost is None else float(cost),
            "max_cost_usd": None if self.max_cost_usd is None else float(self.max_cost_usd),
            "zone": self.zone,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class DryRun:
    """What a provider would launch for a request, launching nothing (a TorchX-style dry run)."""

    plan: LaunchPlan  # the launch a submit would try first
    document: dict[str, Any]  # `orch submit --dry-run --json`, less its "spec" key


def placement(request: LaunchRequest) -> dict[str, Any]:
    """Where the spec asked the nodes to go, as the dry run shows it (only what it set)."""
    asked = {
        "instance_types": list(request.instance_types),
        "regions": list(request.regions),
        "zones": list(request.zones),
        "image": request.image,
        "ports": list(request.ports),
    }
    return {key: value for key, value in asked.items() if value}


_CLOUD_ONLY = {  # placement keys the local provider leaves aside -> their spec fields
    "instance_types": "instance_type",
    "regions": "region",
    "zones": "zone",
    "image": "image",
}


def placement_notes(request: LaunchRequest, *, provider: str) -> tuple[str, ...]:
    """Lines the dry run adds about placement: the ports opened, and on the local provider
    the cloud-only fields it leaves aside (a spec written for AWS rehearsed locally)."""
    notes = []
    if request.ports:
        where = "reachable from this machine" if provider == "local" else "open to this machine"
        notes.append(f"ports {', '.join(request.ports)}: {where} only")
    if provider == "local":
        asked = placement(request)
        fields = ", ".join(
            f"resources.{field}" for key, field in _CLOUD_ONLY.items() if key in asked
        )
        if fields:
            notes.append(f"ignored on local nodes: {fields}")
    return tuple(notes)


def spot_auto_note(spot_price: Decimal, on_demand_price: Decimal) -> str:
    """The dry run's line when `spot: auto` chose spot: its price and how far below on-demand
    it is (spot can be taken back at any time; on-demand cannot)."""
    if on_demand_price <= 0 or spot_price >= on_demand_price:
        return (
            f"spot: auto chose spot at ${spot_price}/node-hour, no dearer than on-demand "
            f"(${on_demand_price}/node-hour)"
        )
    off = (1 - spot_price / on_demand_price) * 100
    return (
        f"spot: auto chose spot at ${spot_price}/node-hour, {off:.0f}% below on-demand "
        f"(${on_demand_price}/node-hour); spot nodes can be taken back (spot: false for "
        "on-demand)"
    )


def local_plan(
    request: LaunchRequest, budget: Budget, on_demand_price: Decimal, spot_price: Decimal
) -> LaunchPlan:
    """The local provider has one offer per market, at its configured prices per node-hour;
    `spot: auto` plans spot when it is the cheaper (as the provider launches it when granted)."""
    spot = request.spot is True or (request.spot == "auto" and spot_price <= on_demand_price)
    chose = (
        (spot_auto_note(spot_price, on_demand_price),) if spot and request.spot == "auto" else ()
    )
    return LaunchPlan(
        provider="local",
        nodes=request.count,
        gpus_per_node=request.gpus_per_node,
        market="spot" if spot else "on-demand",
        instance_type=f"local-{request.gpus_per_node}x",
        price_per_node_hour=spot_price if spot else on_demand_price,
        max_runtime_s=budget.max_runtime,
        max_cost_usd=budget.max_cost_usd,
        notes=placement_notes(request, provider="local") + chose,
    )


def local_dry_run(plan: LaunchPlan, request: LaunchRequest) -> DryRun:
    """The local dry run: its plan, with no offers to list."""
    document = {"provider": plan.provider, "plan": plan.as_dict(), "placement": placement(request)}
    return DryRun(plan, document)


def offer_plan(
    request: LaunchRequest, budget: Budget, offer: Offer, *, provider: str = "aws"
) -> LaunchPlan:
    """The plan a submit would follow with `offer` (the first offer it would try)."""
    chose: tuple[str, ...] = ()
    if request.spot == "auto" and offer.market == "spot":
        chose = (spot_auto_note(offer.price_per_hour, offer.on_demand_price),)
    return LaunchPlan(
        provider=provider,
        nodes=request.count,
        gpus_per_node=request.gpus_per_node,
        market=offer.market,
        instance_type=offer.instance_type,
        price_per_node_hour=offer.price_per_hour,
        max_runtime_s=budget.max_runtime,
        max_cost_usd=budget.max_cost_usd,
        zone=offer.zone,
        notes=placement_notes(request, provider=provider) + chose,
    )


def offers_dry_run(
    request: LaunchRequest,
    budget: Budget,
    offers: list[Offer],
    *,
    provider: str = "aws",
    top: int | None = 10,
) -> dict:
    """The `orch submit --dry-run --provider aws --json` document. Pure.

    `offers` are ranked (cheapest first, `offers.rank_offers`); the plan is built
    from the first one, or is None when nothing fits. `top` limits the offers listed (None: all);
    `offers_total` says how many there were. Each offer row carries its per-node and cluster
    hourly price and its cost for `budget.max_runtime` (None without one).
    """
    nodes = request.count
    runtime = budget.max_runtime
    rows = []
    for offer in offers if top is None else offers[:top]:
        hourly = offer.price_per_hour * nodes
        row = offer.as_dict()
        row["cluster_usd_per_hour"] = str(hourly)
        row["cost_at_max_runtime_usd"] = (
            None if runtime is None else str(hourly * Decimal(str(runtime)) / Decimal(3600))
        )
        rows.append(row)
    plan = offer_plan(request, budget, offers[0], provider=provider) if offers else None
    return {
        "provider": provider,
        "plan": None if plan is None else plan.as_dict(),
        "chosen": rows[0] if rows else None,
        "offers": rows,
        "offers_total": len(offers),
        "placement": placement(request),
    }
