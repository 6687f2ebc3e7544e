"""Two ledgers on one AWS account (a moto server on 127.0.0.1), same login name: each ends only
its own nodes; a controller acting as another region or endpoint touches nothing.

The providers launch through a real boto3 client against moto; `orch reconcile` and `orch down`
run as the real CLI in a subprocess with ORCH_HOME of their own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import AwsSettings, Settings
from orchestrator.control.process.controllers import register_job
from orchestrator.control.repair.reconcile import reconcile
from orchestrator.control.run.runner import JobRunner
from orchestrator.errors import IdentityMismatch, InstancesNotFound
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Lease, Ledger, make_engine
from orchestrator.providers.aws.ec2_requests import new_host_key
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.spec.loading import load_job
from tests.support.helpers import orch_env, run_orch

pytestmark = pytest.mark.timeout(120)

REGION = "us-east-1"
PUBLIC_KEY = new_host_key().public_line + " orch-test"


def settings_for(home: Path, endpoint: str, **aws: Any) -> Settings:
    options: dict[str, Any] = {
        "regions": [REGION],
        "endpoint_url": endpoint,
        "ami_name": "ubuntu/images/*",
        "ami_owners": [],
        "owner": "tester",  # one login name for both ledgers
        "poll_interval_s": 0.01,
        "ready_timeout_s": 10,
        "wait_for_ssh": False,
    }
    options.update(aws)
    return Settings(home=home, aws=AwsSettings(**options))


def launch(provider: AwsProvider, job: str, ledger_id: str | None, count: int = 1) -> list[str]:
    request = LaunchRequest(
        job_id=job, cluster=job, count=count, gpus_per_node=1, public_key=PUBLIC_KEY,
        spot=False, accelerator="A10G", ledger_id=ledger_id,
    )  # fmt: skip
    return [n.instance_id for n in provider.launch(request)]


def states(provider: AwsProvider) -> dict[str, str]:
    pages = provider.client(REGION).get_paginator("describe_instances").paginate()
    return {
        i["InstanceId"]: i["State"]["Name"]
        for page in pages
        for r in page["Reservations"]
        for i in r["Instances"]
    }


def lease_for(ledger: Ledger, job_id: str, node: Instance, identity: str | None) -> None:
    ledger.open_lease(
        Lease(
            job_id=job_id, cluster=node.cluster, provider="aws", instance_id=node.instance_id,
            rank=node.rank, market=node.market, instance_type=node.instance_type,
            price_per_hour=node.price_per_hour, launched_at=node.launched_at, identity=identity,
        )
    )  # fmt: skip


@pytest.fixture
def two_ledgers(tmp_path: Path, moto_endpoint: str) -> tuple[Any, Any]:
    """(settings, provider, ledger) for ORCH_HOMEs `a` and `b`."""
    homes = []
    for name in ("a", "b"):
        settings = settings_for(tmp_path / name, moto_endpoint)
        homes.append((settings, AwsProvider(settings), Ledger(make_engine(settings.db_path))))
    return homes[0], homes[1]


def test_reconcile_ends_only_its_own_ledgers_nodes(two_ledgers: tuple[Any, Any]) -> None:
    (_, mine, ours), (_, theirs, other) = two_ledgers
    assert ours.ledger_id != other.ledger_id
    own = launch(mine, "ghost", ours.ledger_id)  # a job this ledger does not know: an orphan
    foreign = launch(theirs, "ghost", other.ledger_id, count=2)  # same job name, other ledger
    untagged = launch(mine, "legacy", None)  # an orch node without a ledger tag
    report = reconcile(mine.settings, ours, [mine])
    assert report.terminated == {"ghost": own}
    assert report.not_ours == sorted(foreign + untagged)
    now = states(mine)
    assert now[own[0]] in ("shutting-down", "terminated")
    assert all(now[i] == "running" for i in foreign + untagged)
    # the other ledger's reconcile ends its own orphans, and never the first one's
    report = reconcile(theirs.settings, other, [theirs])
    assert report.terminated == {"ghost": sorted(foreign)}
    assert report.not_ours == untagged


def test_the_cli_reconcile_and_down_report_other_ledgers_nodes_and_spare_them(
    tmp_path: Path, moto_endpoint: str, two_ledgers: tuple[Any, Any]
) -> None:
    (mine_settings, mine, ours), (_, theirs, other) = two_ledgers
    own = launch(mine, "orphan", ours.ledger_id)
    foreign = launch(theirs, "theirs", other.ledger_id, count=3)
    env = orch_env(
        mine_settings.home,
        ORCH_AWS_ENDPOINT_URL=moto_endpoint,
        ORCH_AWS_REGIONS=REGION,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )
    dry = run_orch(["reconcile", "--dry-run", "--json"], env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["not_ours"] == sorted(foreign)
    result = run_orch(["reconcile"], env)
    assert result.returncode == 0, result.stderr
    assert "3 instances of another ledger: not ours" in result.stdout
    assert states(mine)[own[0]] in ("shutting-down", "terminated")

    again = launch(mine, "orphan2", ours.ledger_id)
    downed = run_orch(["down", "--all"], env)
    assert downed.returncode == 0, downed.stderr
    assert "orphan2: terminated 1 aws node(s)" in downed.stdout
    assert "3 instances of another ledger: not ours" in downed.stdout
    refused = run_orch(["down", "theirs"], env)
    assert refused.returncode == 2 and "of this ledger" in refused.stderr
    now = states(mine)
    assert now[again[0]] in ("shutting-down", "terminated")
    assert all(now[i] == "running" for i in foreign)


def test_terminate_raises_for_ids_it_cannot_find(two_ledgers: tuple[Any, Any]) -> None:
    (_, provider, ledger), _ = two_ledgers
    (node,) = launch(provider, "job", ledger.ledger_id)
    with pytest.raises(InstancesNotFound) as raised:
        provider.terminate([node, "i-0000000000000dead"])
    assert raised.value.instance_ids == ("i-0000000000000dead",)
    assert raised.value.ended_at is not None
    assert states(provider)[node] in ("shutting-down", "terminated")  # the known one ended
    provider.terminate([node])  # already ended: idempotent, no error


def test_a_node_in_another_region_is_not_found_there(two_ledgers: tuple[Any, Any]) -> None:
    (settings, provider, ledger), _ = two_ledgers
    (node,) = launch(provider, "job", ledger.ledger_id)
    endpoint = str(settings.aws.endpoint_url)
    elsewhere = AwsProvider(settings_for(settings.home, endpoint, regions=["us-west-2"]))
    with pytest.raises(InstancesNotFound):
        elsewhere.terminate([node])
    assert states(provider)[node] == "running"


def test_identity_is_the_account_regions_and_endpoint(two_ledgers: tuple[Any, Any]) -> None:
    (settings, provider, _), _ = two_ledgers
    identity = provider.identity()
    assert identity.account.isdigit() and len(identity.account) == 12
    assert identity.region == REGION and identity.endpoint == settings.aws.endpoint_url
    assert provider.identity() is identity  # asked once


@pytest.mark.parametrize("change", ["region", "endpoint"])
def test_a_revived_controller_with_another_identity_touches_nothing(
    tmp_path: Path, moto_endpoint: str, change: str
) -> None:
    started = settings_for(tmp_path / "orch", moto_endpoint)
    provider = AwsProvider(started)
    ledger = Ledger(make_engine(started.db_path))
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: owned\nworkdir: work\nrun: python train.py\nprovider: aws\n"
        "resources: {nodes: 1, gpus_per_node: 1, accelerator: A10G, spot: false}\n"
    )
    loaded = load_job(spec)
    job = register_job(started, ledger, loaded, "aws", "owned-000001")
    identity = provider.identity().to_json()
    request = LaunchRequest(
        job_id=job.id, cluster=job.id, count=1, gpus_per_node=1, public_key=PUBLIC_KEY,
        spot=False, accelerator="A10G", ledger_id=ledger.ledger_id,
    )  # fmt: skip
    (node,) = provider.launch(request)
    lease_for(ledger, job.id, node, identity)
    job = ledger.update_job(job.id, state=JobState.RUNNING, identity=identity)

    # The same cloud (one moto server), reached as another region or by another endpoint name.
    other = (
        {"regions": ["us-west-2"]}
        if change == "region"
        else {"endpoint_url": moto_endpoint.replace("127.0.0.1", "localhost")}
    )
    revived = settings_for(started.home, moto_endpoint, **other)
    runner = JobRunner(job, loaded, settings=revived, ledger=ledger, provider=AwsProvider(revived))
    with pytest.raises(IdentityMismatch) as raised:
        runner.run()
    message = str(raised.value)
    assert provider.identity().describe() in message
    assert AwsProvider(revived).identity().describe() in message

    assert states(provider) == {node.instance_id: "running"}
    after = ledger.get_job(job.id)
    assert after.state == JobState.RUNNING and after.ended_at is None
    assert [lease.ended_at for lease in ledger.leases(job.id)] == [None]
    assert [e.kind for e in ledger.events(job.id)] == ["REFUSED"]
    with pytest.raises(IdentityMismatch):  # refused again, and said once
        runner.run()
    assert [e.kind for e in ledger.events(job.id)] == ["REFUSED"]
