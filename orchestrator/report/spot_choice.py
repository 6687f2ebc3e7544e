"""The bill's word on `spot: auto`: when it chose spot for a job's nodes, at what price and
how far below on-demand, so a price lower than the one configured is explained where it is
billed (`orch cost --job JOB`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol


class _Lease(Protocol):
    market: str
    price_per_hour: Decimal


class _Reads(Protocol):
    def rows(self, kind: type[Any], table: str, clause: str = "", *args: object) -> list[Any]: ...


class _LeaseReads(_Reads, Protocol):
    def leases(self, job_id: str) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class _SpecRow:
    spec_json: str


def asked_spot(view: _Reads, job_id: str) -> object:
    """The job's `resources.spot` as submitted (flags applied): True, False, "auto", or None
    when the ledger does not say."""
    found = view.rows(_SpecRow, "job", "WHERE id = ?", job_id)
    try:
        return json.loads(found[0].spec_json)["resources"]["spot"] if found else None
    except (ValueError, KeyError, TypeError):
        return None


def spot_auto_choice(
    spot: object, leases: Sequence[_Lease], on_demand: Decimal | None
) -> dict[str, Any] | None:
    """What the bill says when the job asked `spot: auto` and some of its nodes ran on spot:
    how many, their price per node-hour (the highest of them), the on-demand price per
    node-hour it was compared with (`on_demand`: the provider's, or None when not known), the
    discount in percent, and the line shown. None otherwise."""
    spot_leases = [lease for lease in leases if lease.market == "spot"]
    if spot != "auto" or not spot_leases:
        return None
    price = max(lease.price_per_hour for lease in spot_leases)
    discount = None
    if on_demand is not None and on_demand > 0 and price < on_demand:
        discount = int(((1 - price / on_demand) * 100).to_integral_value())
    line = (
        f"spot: auto chose spot for {len(spot_leases)} of the {len(leases)} node(s) launched, "
        f"at ${price}/node-hour"
    )
    if discount is not None:
        line += f", {discount}% below on-demand (${on_demand}/node-hour)"
    elif on_demand is not None:
        line += f", no dearer than on-demand (${on_demand}/node-hour)"
    return {
        "nodes": len(spot_leases),
        "price_per_node_hour": str(price),
        "on_demand_price_per_node_hour": None if on_demand is None else str(on_demand),
        "discount_pct": discount,
        "line": line + "; spot: false runs on-demand",
    }


def spot_auto_of(
    view: _LeaseReads, job_id: str, local_price: Callable[[], Decimal]
) -> dict[str, Any] | None:
    """`spot_auto_choice` of one job: compared with the on-demand price its own on-demand nodes
    were billed at, else (local nodes) the configured one (`local_price`, asked only then)."""
    leases = view.leases(job_id)
    if not any(lease.market == "spot" for lease in leases):
        return None
    spot = asked_spot(view, job_id)
    on_demand = max((ls.price_per_hour for ls in leases if ls.market == "on-demand"), default=None)
    if on_demand is None and spot == "auto" and all(ls.provider == "local" for ls in leases):
        on_demand = local_price()
    return spot_auto_choice(spot, leases, on_demand)
