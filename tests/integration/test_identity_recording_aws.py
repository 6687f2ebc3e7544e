"""A launch records the cloud identity it was made as, on the job and on every node's lease.

The runner launches and terminates real instances through boto3 against a moto server on
127.0.0.1; the nodes themselves are not reached (the runner's attempts, checkpoint keeper and
supervisor are the unit tests' stand-ins), so what is shown is what the ledger keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.process.controllers import register_job
from orchestrator.control.run.runner import JobRunner
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import CloudIdentity
from orchestrator.spec.loading import load_job
from tests.integration.test_ownership_aws import REGION, settings_for, states
from tests.support.runner_fakes import FAST, FakeKeeper, open_fake, scripted

pytestmark = pytest.mark.timeout(120)


def test_a_launch_records_its_identity_on_the_job_and_every_lease(
    tmp_path: Path, moto_endpoint: str
) -> None:
    settings = settings_for(tmp_path / "orch", moto_endpoint)
    provider = AwsProvider(settings)
    ledger = Ledger(make_engine(settings.db_path))
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: recorded\nworkdir: work\nrun: python train.py\nprovider: aws\n"
        "resources: {nodes: 2, gpus_per_node: 1, accelerator: A10G, spot: false}\n"
        "budget: {max_cost_usd: 50}\n"
    )
    loaded = load_job(spec)
    job = register_job(settings, ledger, loaded, "aws", "recorded-000001")
    assert job.identity is None

    outcome = JobRunner(
        job, loaded, settings=settings, ledger=ledger, provider=provider, options=FAST,
        open_attempt=open_fake, keeper=cast(CheckpointKeeper, FakeKeeper()),
        supervise=scripted(StopOrder(JobState.SUCCEEDED, 0, "")),
    ).run()  # fmt: skip
    assert (outcome.state, outcome.exit_code) == (JobState.SUCCEEDED, 0)

    recorded = ledger.get_job(job.id).identity
    assert recorded is not None
    identity = CloudIdentity.from_json(recorded)
    assert identity == AwsProvider(settings).identity()
    assert identity.provider == "aws" and len(identity.account) == 12
    assert identity.region == REGION and identity.endpoint == moto_endpoint
    leases = ledger.leases(job.id)
    assert len(leases) == 2 and {lease.identity for lease in leases} == {recorded}
    assert sorted(states(provider)) == sorted(lease.instance_id for lease in leases)
    assert all(lease.ended_at is not None for lease in leases)
