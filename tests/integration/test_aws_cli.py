"""The AWS verbs of the CLI against a moto server on 127.0.0.1: catalog, dry run, reconcile."""

from __future__ import annotations

import json
from pathlib import Path

import boto3

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import orch_env, run_orch


def test_catalog_lists_types_and_prices(tmp_path: Path) -> None:
    result = run_orch(["catalog", "--gpu", "A10G", "--json"], orch_env(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["types"]
    assert rows and {row["gpu"] for row in rows} == {"A10G"}
    g5 = next(row for row in rows if row["instance_type"] == "g5.xlarge")
    assert g5["on_demand_usd_per_hour"]["us-east-1"] == "1.006"


def test_dry_run_on_aws_picks_the_cheapest_fitting_offer(
    tmp_path: Path, moto_endpoint: str
) -> None:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: plan\nworkdir: work\nrun: python train.py\n"
        "resources: {nodes: 2, gpus_per_node: 4, accelerator: A10G, spot: false}\n"
        "budget: {max_runtime: 2h}\n"
    )
    env = orch_env(tmp_path / "orch", ORCH_AWS_ENDPOINT_URL=moto_endpoint)
    result = run_orch(["submit", str(spec), "--provider", "aws", "--dry-run", "--json"], env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    plan = document["plan"]
    assert plan["instance_type"] == "g5.12xlarge" and plan["market"] == "on-demand"
    assert plan["hourly_usd"] == 2 * 5.672
    assert plan["cost_at_max_runtime_usd"] == 2 * 2 * 5.672
    prices = [float(offer["price_per_hour"]) for offer in document["offers"]]
    assert prices == sorted(prices)
    assert not (tmp_path / "orch" / "orch.db").exists()  # a dry run writes nothing


def test_reconcile_ends_orphans_tagged_by_orch_only(tmp_path: Path, moto_endpoint: str) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint)
    image = ec2.describe_images()["Images"][0]["ImageId"]

    def launch(tags: list[dict[str, str]]) -> str:
        extra = {"TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]} if tags else {}
        reply = ec2.run_instances(
            ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, **extra
        )
        return reply["Instances"][0]["InstanceId"]

    ledger = Ledger(make_engine(tmp_path / "orch" / "orch.db"))  # the one the CLI opens
    ghost = launch(
        [{"Key": "orch-job", "Value": "ghost"}, {"Key": "orch-ledger", "Value": ledger.ledger_id}]
    )
    bystander = launch([])
    env = orch_env(
        tmp_path / "orch", ORCH_AWS_ENDPOINT_URL=moto_endpoint, ORCH_AWS_REGIONS="us-east-1"
    )
    listed = run_orch(["reconcile", "--dry-run", "--json"], env)
    assert json.loads(listed.stdout)["terminated"] == {"ghost": [ghost]}
    assert (
        ec2.describe_instances(InstanceIds=[ghost])["Reservations"][0]["Instances"][0]["State"][
            "Name"
        ]
        == "running"
    )  # a dry run ends nothing
    result = run_orch(["reconcile", "--json"], env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["terminated"] == {"ghost": [ghost]}
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
    }
    assert states[ghost] in ("shutting-down", "terminated")
    assert states[bystander] == "running"
