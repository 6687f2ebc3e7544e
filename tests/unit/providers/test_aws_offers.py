"""Pure parts of the AWS provider: catalog, offer ranking, dry-run document, launch arguments."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.providers.aws.catalog import (
    catalog_document,
    catalog_rows,
    load_catalog,
    parse_catalog,
)
from orchestrator.providers.aws.ec2_requests import (
    client_token,
    instance_from_description,
    new_host_key,
    read_tf_outputs,
    run_instances_args,
)
from orchestrator.providers.base import LaunchRequest, ZoneMarket
from orchestrator.providers.offers import (
    OfferQuery,
    SpotPriceSource,
    collect_offers,
    launch_order,
    newest_spot_prices,
    rank_offers,
    zone_markets,
)
from orchestrator.providers.plan import offers_dry_run
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec

CATALOG = load_catalog()
GIVEN_US_EAST_1 = {
    "g4dn.xlarge": "0.526",
    "g4dn.12xlarge": "3.912",
    "g5.xlarge": "1.006",
    "g5.12xlarge": "5.672",
    "p3.2xlarge": "3.06",
    "p3.8xlarge": "12.24",
    "p3.16xlarge": "24.48",
    "p4d.24xlarge": "21.96",
    "p5.48xlarge": "55.04",
}
E1 = "us-east-1"
ZONES = {(E1, t.name): [f"{E1}a", f"{E1}b", f"{E1}c"] for t in CATALOG.types}
# The price fixture: spot per (region, zone, type).
SPOT = {
    (E1, "us-east-1a", "g5.xlarge"): Decimal("0.45"),
    (E1, "us-east-1b", "g5.xlarge"): Decimal("0.31"),
    (E1, "us-east-1c", "g5.xlarge"): Decimal("1.006"),  # not below on-demand: no offer
    (E1, "us-east-1a", "g4dn.xlarge"): Decimal("0.20"),
    (E1, "us-east-1a", "g5.12xlarge"): Decimal("2.10"),
    (E1, "us-east-1b", "g5.12xlarge"): Decimal("1.90"),
}


def rank(**query: object) -> list:
    return rank_offers(CATALOG, OfferQuery(**query), regions=[E1], zones=ZONES, spot_prices=SPOT)


def test_catalog_has_the_families_and_the_given_prices() -> None:
    assert CATALOG.version == 1 and CATALOG.date == "2026-11-30"
    assert {t.family for t in CATALOG.types} >= {"g4dn", "g5", "g6", "p3", "p4d", "p5"}
    for name, price in GIVEN_US_EAST_1.items():
        itype = CATALOG.get(name)
        assert itype is not None and itype.price_in(E1) == Decimal(price)
    for itype in CATALOG.types:
        assert set(itype.on_demand) == {"us-east-1", "us-east-2", "us-west-2"}
    assert CATALOG.get("p4d.24xlarge").gpu == "A100"  # type: ignore[union-attr]


def test_catalog_query_and_rows() -> None:
    names = [t.name for t in CATALOG.query(accelerator="a10g", gpus=4)]
    assert names == ["g5.12xlarge", "g5.24xlarge", "g5.48xlarge"]
    assert {t.gpu for t in CATALOG.query(min_gpu_memory_gb=40)} == {"A100", "H100"}
    rows = catalog_rows(CATALOG, gpu="T4")
    assert rows[0]["instance_type"] == "g4dn.xlarge"
    assert rows[0]["on_demand_usd_per_hour"]["us-east-1"] == "0.526"
    doc = catalog_document(CATALOG)
    assert json.loads(json.dumps(doc))["types"] and len(doc["types"]) == len(CATALOG.types)


def test_bad_catalog_names_the_field(tmp_path: Path) -> None:
    data = json.loads(
        (Path(__file__).parents[3] / "orchestrator/data/aws_catalog.json").read_text()
    )
    data["types"][0]["gpus"] = 0
    with pytest.raises(ConfigError, match=r"types\.0\.gpus"):
        parse_catalog(data)
    data["types"][0]["gpus"] = 1
    data["version"] = 2
    with pytest.raises(ConfigError, match="version"):
        parse_catalog(data)
    path = tmp_path / "c.json"
    path.write_text("{")
    with pytest.raises(ConfigError, match="cannot read"):
        load_catalog(path)


def test_cheapest_spot_offer_first_and_bad_zones_dropped() -> None:
    offers = rank(spot=True, accelerator="A10G")
    assert [(o.instance_type, o.zone, str(o.price_per_hour)) for o in offers] == [
        ("g5.xlarge", "us-east-1b", "0.31"),
        ("g5.xlarge", "us-east-1a", "0.45"),
        ("g5.12xlarge", "us-east-1b", "1.90"),
        ("g5.12xlarge", "us-east-1a", "2.10"),
    ]
    assert all(o.market == "spot" for o in offers)


def test_on_demand_only_and_auto() -> None:
    on_demand = rank(spot=False, accelerator="A10G")
    assert {o.market for o in on_demand} == {"on-demand"}
    assert [o.zone for o in on_demand[:3]] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert on_demand[0].price_per_hour == Decimal("1.006")
    auto = rank(spot="auto", accelerator="A10G")
    assert auto[0].market == "spot" and auto[0].price_per_hour == Decimal("0.31")
    assert {o.market for o in auto} == {"spot", "on-demand"}
    prices = [o.price_per_hour for o in auto]
    assert prices == sorted(prices)


def test_filters_hold() -> None:
    cheap = rank(spot="auto", max_price_per_hour=Decimal("0.5"))
    assert cheap and all(o.price_per_hour <= Decimal("0.5") for o in cheap)
    assert cheap[0].instance_type == "g4dn.xlarge" and cheap[0].market == "spot"
    four = rank(spot=False, gpus_per_node=4)
    assert four and all(o.gpus >= 4 for o in four)
    assert four[0].instance_type == "g4dn.12xlarge"
    big = rank(spot=False, gpus_per_node=8, min_gpu_memory_gb=40)
    assert [o.instance_type for o in big][::3] == ["p4d.24xlarge", "p5.48xlarge"]
    assert rank(spot=False, accelerator="B200") == []


def test_ties_break_stably() -> None:
    spot = {(E1, z, "g5.xlarge"): Decimal("0.4") for z in ("us-east-1c", "us-east-1a")}
    spot.update({(E1, "us-east-1a", "g5.12xlarge"): Decimal("0.4")})
    offers = rank_offers(
        CATALOG,
        OfferQuery(spot=True, accelerator="A10G"),
        regions=[E1],
        zones=ZONES,
        spot_prices=spot,
    )
    assert [(o.instance_type, o.zone) for o in offers] == [
        ("g5.xlarge", "us-east-1a"),
        ("g5.xlarge", "us-east-1c"),
        ("g5.12xlarge", "us-east-1a"),
    ]


def test_newest_spot_price_per_zone_wins() -> None:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    history = [
        {
            "AvailabilityZone": "z1",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.5",
            "Timestamp": now,
        },
        {
            "AvailabilityZone": "z1",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.9",
            "Timestamp": now - timedelta(hours=1),
        },
        {"AvailabilityZone": "z2", "InstanceType": "g5.xlarge", "SpotPrice": ""},
    ]
    assert newest_spot_prices(E1, history) == {(E1, "z1", "g5.xlarge"): Decimal("0.5")}


class FakeEc2:
    """Just enough of an EC2 client for SpotPriceSource: paginators over fixed pages."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_paginator(self, name: str) -> FakeEc2:
        self.calls.append(name)
        self._name = name
        return self

    def paginate(self, **_: object) -> list[dict]:
        if self._name == "describe_spot_price_history":
            return [
                {"SpotPriceHistory": [SPOT_REC("us-east-1a", "0.3")]},
                {"SpotPriceHistory": [SPOT_REC("us-east-1b", "0.2")]},
            ]
        return [
            {
                "InstanceTypeOfferings": [
                    {"InstanceType": "g5.xlarge", "Location": z}
                    for z in ("us-east-1b", "us-east-1a")
                ]
            }
        ]


def SPOT_REC(zone: str, price: str) -> dict:  # noqa: N802
    return {"AvailabilityZone": zone, "InstanceType": "g5.xlarge", "SpotPrice": price}


def test_spot_price_source_pages_and_caches() -> None:
    ec2 = FakeEc2()
    clock = [0.0]
    source = SpotPriceSource(lambda region: ec2, ttl_s=60, clock=lambda: clock[0])
    query = OfferQuery(spot=True, accelerator="A10G")
    offers = collect_offers(CATALOG, query, regions=[E1], source=source)
    assert [(o.zone, str(o.price_per_hour)) for o in offers] == [
        ("us-east-1b", "0.2"),
        ("us-east-1a", "0.3"),
    ]
    calls = len(ec2.calls)
    collect_offers(CATALOG, query, regions=[E1], source=source)
    assert len(ec2.calls) == calls  # cached
    clock[0] = 61
    collect_offers(CATALOG, query, regions=[E1], source=source)
    assert len(ec2.calls) == 2 * calls


def test_dry_run_document() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "cifar",
            "workdir": ".",
            "run": "python train.py",
            "resources": {"nodes": 2, "gpus_per_node": 1, "accelerator": "A10G", "spot": True},
            "budget": {"max_runtime": 7200, "max_cost_usd": 20},
        }
    )
    offers = rank_offers(
        CATALOG,
        OfferQuery.from_resources(spec.resources),
        regions=[E1],
        zones=ZONES,
        spot_prices=SPOT,
    )
    request = launch_request(spec, "cifar")
    doc = json.loads(json.dumps(offers_dry_run(request, spec.budget, offers, top=2)))
    assert doc["offers_total"] == 4 and len(doc["offers"]) == 2
    assert doc["chosen"]["instance_type"] == "g5.xlarge" and doc["chosen"]["zone"] == "us-east-1b"
    assert doc["chosen"]["cluster_usd_per_hour"] == "0.62"
    assert Decimal(doc["chosen"]["cost_at_max_runtime_usd"]) == Decimal("1.24")
    plan = doc["plan"]
    assert plan["provider"] == "aws" and plan["market"] == "spot" and plan["nodes"] == 2
    assert plan["price_per_node_hour"] == 0.31 and plan["cost_at_max_runtime_usd"] == 1.24
    assert offers_dry_run(request, spec.budget, [])["plan"] is None


def test_launch_arguments_and_token() -> None:
    req = LaunchRequest(
        job_id="j1", cluster="j1", count=2, gpus_per_node=1, public_key="k", spot=True
    )
    offer = rank(spot=True, accelerator="A10G")[0]
    token = client_token(req, 0, offer)
    assert token == client_token(req, 0, offer) and len(token) <= 64
    assert token != client_token(req, 1, offer)
    retry = LaunchRequest(**{**req.__dict__, "attempt": 1})
    assert token != client_token(retry, 0, offer)
    args = run_instances_args(
        offer,
        image_id="ami-1",
        subnet_id="subnet-1",
        security_group_ids=["sg-1"],
        key_name=None,
        tags={"orch-job": "j1"},
        token=token,
        user_data_text="#cloud-config\n",
        max_price=Decimal("0.5"),
        root_device_name="/dev/sda1",
    )
    assert args["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "0.5"
    assert args["MinCount"] == args["MaxCount"] == 1 and "KeyName" not in args
    assert [s["ResourceType"] for s in args["TagSpecifications"]] == ["instance", "volume"]
    assert args["Placement"] == {"AvailabilityZone": "us-east-1b"}


def test_every_node_requires_imdsv2_and_an_encrypted_root_volume() -> None:
    offer = rank(spot=False, accelerator="A10G")[0]
    common: dict = {
        "image_id": "ami-1",
        "subnet_id": "subnet-1",
        "security_group_ids": ["sg-1"],
        "key_name": "k",
        "tags": {"orch-job": "j1"},
        "token": "t",
        "user_data_text": "#cloud-config\n",
        "max_price": None,
    }
    args = run_instances_args(offer, **common, root_device_name="/dev/xvda")
    assert args["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 2,
    }
    # the image's own size when the spec gives none: no VolumeSize at all
    assert args["BlockDeviceMappings"] == [
        {
            "DeviceName": "/dev/xvda",
            "Ebs": {"Encrypted": True, "VolumeType": "gp3", "DeleteOnTermination": True},
        }
    ]
    sized = run_instances_args(offer, **common, root_device_name="/dev/sda1", disk_size_gb=200)
    [root] = sized["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/sda1" and root["Ebs"]["VolumeSize"] == 200
    assert root["Ebs"]["Encrypted"] is True


def test_instance_from_description() -> None:
    key = new_host_key()
    desc = {
        "InstanceId": "i-1",
        "InstanceType": "g5.xlarge",
        "PrivateIpAddress": "10.0.0.5",
        "LaunchTime": datetime(2026, 11, 30, 8, tzinfo=UTC),
        "InstanceLifecycle": "spot",
        "Tags": [
            {"Key": "orch-job", "Value": "j"},
            {"Key": "orch-node-rank", "Value": "1"},
            {"Key": "orch-price", "Value": "0.31"},
            {"Key": "orch-host-key", "Value": key.public_line},
        ],
    }
    node = instance_from_description(desc, ssh_user="ubuntu", interface="ens5")
    assert node is not None
    assert (node.rank, node.ssh_host, node.market) == (1, "10.0.0.5", "spot")
    assert node.price_per_hour == Decimal("0.31") and node.host_key == key.public_line
    assert instance_from_description({"InstanceId": "i-2"}, ssh_user="u", interface="e") is None


def test_terraform_outputs(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text(json.dumps({"key_name": {"value": "k"}, "subnet_ids": {"value": {"a": "s"}}}))
    outputs = read_tf_outputs(path)
    assert outputs.key_name == "k" and outputs.subnet_ids == {"a": "s"}
    path.write_text("[]")
    with pytest.raises(ConfigError):
        read_tf_outputs(path)


def test_a_zone_aware_policy_orders_the_launch_by_its_zones() -> None:
    """The spec's zones only filter (price first); a spot policy's zones are its order, and
    the zone that just took the nodes back still comes last."""
    offers = rank(accelerator="A10G", spot="auto", instance_types=("g5.xlarge",))
    where = [(o.zone, o.market) for o in offers]
    assert where[:2] == [("us-east-1b", "spot"), ("us-east-1a", "spot")]
    request = LaunchRequest(job_id="j", cluster="j", count=1, gpus_per_node=1, public_key="")
    assert launch_order(offers, replace(request, zones=("us-east-1a", "us-east-1b"))) == offers
    ordered = replace(request, zones=("us-east-1a", "us-east-1c", "us-east-1b"), zones_ordered=True)
    assert [(o.zone, o.market) for o in launch_order(offers, ordered)] == [
        ("us-east-1a", "spot"), ("us-east-1a", "on-demand"), ("us-east-1c", "on-demand"),
        ("us-east-1b", "spot"), ("us-east-1b", "on-demand"),
    ]  # fmt: skip
    avoiding = replace(ordered, avoid_zones=("us-east-1a",))
    assert [o.zone for o in launch_order(offers, avoiding)][-2:] == ["us-east-1a"] * 2
    spec = JobSpec.model_validate({"name": "z", "workdir": ".", "run": "true"})
    chosen = launch_request(spec, "j", zones=("us-east-1c", "us-east-1a"))
    assert (chosen.zones, chosen.zones_ordered) == (("us-east-1c", "us-east-1a"), True)
    assert not launch_request(spec, "j").zones_ordered


def test_zone_markets_are_the_cheapest_offer_of_each_market_per_zone() -> None:
    offers = rank(accelerator="A10G", spot="auto", instance_types=("g5.xlarge",))
    od = Decimal("1.006")
    assert zone_markets(offers) == (
        ZoneMarket("us-east-1a", None, Decimal("0.45"), od),
        ZoneMarket("us-east-1b", None, Decimal("0.31"), od),
        ZoneMarket("us-east-1c", False, None, od),  # spot at on-demand's price: no offer
    )
