"""What providers tell the deadline-aware spot policies (`MarketView`): spot availability and
the prices of each market, and per zone (`ZoneMarketView`) for the zone-aware ones; AWS
against a moto EC2 server on 127.0.0.1."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import AwsSettings, LocalSettings, Settings
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import LaunchRequest, MarketView, ZoneMarketView
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.offers import OfferQuery

pytestmark = pytest.mark.timeout(60)


def request(spot: bool | str = "auto") -> LaunchRequest:
    return LaunchRequest(
        job_id="job1", cluster="job1", count=1, gpus_per_node=1, public_key="",
        spot=spot, accelerator="A10G",  # type: ignore[arg-type]
    )  # fmt: skip


def test_aws_prices_are_the_cheapest_offer_of_each_market(
    tmp_path: Path, moto_endpoint: str
) -> None:
    provider = AwsProvider(
        Settings(
            home=tmp_path,
            aws=AwsSettings(regions=["us-east-1"], endpoint_url=moto_endpoint, owner="tester"),
        )
    )
    assert isinstance(provider, MarketView)
    assert provider.spot_available(2) is None  # EC2 cannot tell before a launch is tried
    offers = provider.offers(OfferQuery(accelerator="A10G", spot="auto"))
    prices = provider.market_prices(request(spot=False))  # whatever the job's own market
    assert prices.on_demand == min(o.price_per_hour for o in offers if o.market == "on-demand")
    assert prices.spot == min(o.price_per_hour for o in offers if o.market == "spot")
    assert prices.spot is not None and prices.on_demand is not None
    assert prices.spot < prices.on_demand


def test_aws_zone_markets_are_the_cheapest_offers_of_each_zone(
    tmp_path: Path, moto_endpoint: str
) -> None:
    provider = AwsProvider(
        Settings(
            home=tmp_path,
            aws=AwsSettings(regions=["us-east-1"], endpoint_url=moto_endpoint, owner="tester"),
        )
    )
    assert isinstance(provider, ZoneMarketView)
    markets = provider.zone_markets(request(spot=True))  # both markets, whatever the job's
    offers = provider.offers(OfferQuery(accelerator="A10G", spot="auto"))
    assert [m.zone for m in markets] == sorted({o.zone for o in offers})
    assert any(m.spot_price is not None for m in markets)
    for market in markets:
        here = [o for o in offers if o.zone == market.zone]
        spot = [o.price_per_hour for o in here if o.market == "spot"]
        on_demand = [o.price_per_hour for o in here if o.market == "on-demand"]
        assert market.on_demand_price == min(on_demand)
        assert market.spot_price == (min(spot) if spot else None)
        # EC2 cannot tell whether spot would be granted; a zone without a spot offer has none
        assert market.spot_available is (None if spot else False)
    assert not isinstance(LocalProvider(Settings(home=tmp_path)), ZoneMarketView)  # one zone


def test_local_prices_and_spot_capacity(tmp_path: Path) -> None:
    provider = LocalProvider(
        Settings(home=tmp_path, local=LocalSettings(price_per_hour=Decimal("0.90")))
    )
    assert isinstance(provider, MarketView)
    prices = provider.market_prices(request())
    assert (prices.spot, prices.on_demand) == (Decimal("0.300000"), Decimal("0.90"))
    assert provider.spot_available(3) is True
    provider.set_spot_available(False)
    assert provider.spot_available(1) is False
