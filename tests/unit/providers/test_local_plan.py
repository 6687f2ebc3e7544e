"""The local dry run prices the market the local provider would launch on."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.providers.plan import local_plan
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec


@pytest.mark.parametrize(
    ("spot", "market", "price"),
    [(True, "spot", "0.3"), ("auto", "spot", "0.3"), (False, "on-demand", "0.9")],
)
def test_local_plan_prices_the_market_it_launches(spot: object, market: str, price: str) -> None:
    spec = JobSpec.model_validate(
        {"name": "p", "workdir": ".", "run": "true", "resources": {"spot": spot}}
    )
    plan = local_plan(launch_request(spec, "p"), spec.budget, Decimal("0.9"), Decimal("0.3"))
    assert plan.market == market and plan.price_per_node_hour == Decimal(price)


def test_auto_stays_on_demand_when_spot_is_dearer() -> None:
    spec = JobSpec.model_validate(
        {"name": "p", "workdir": ".", "run": "true", "resources": {"spot": "auto"}}
    )
    plan = local_plan(launch_request(spec, "p"), spec.budget, Decimal("0.2"), Decimal("0.3"))
    assert plan.market == "on-demand" and plan.price_per_node_hour == Decimal("0.2")
