"""`orch cancel` of a job recorded under one cloud identity, run as another: it refuses, names
both, and ends nothing (`cancel.check_job_identity`). Real ledger (SQLite in tmp_path) and
controller lock; the provider is a stand-in that records what it is asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.control.process.controllers import ControllerLock
from orchestrator.control.verbs import cancel as cancel_module
from orchestrator.control.verbs.cancel import CancelRoute, cancel, check_job_identity
from orchestrator.errors import IdentityMismatch
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Lease, Ledger, utcnow
from orchestrator.providers.base import CloudIdentity, Instance

JOB_ID = "owned-1"
STARTED_AS = CloudIdentity("aws", "123456789012", "us-east-1", None)
LAUNCHED = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Cloud:
    """A provider acting as `acts_as`, running this ledger's node of the job."""

    ledger_id: str
    acts_as: CloudIdentity
    name: str = "aws"
    asked: list[str] = field(default_factory=list)
    terminated: list[list[str]] = field(default_factory=list)

    def identity(self) -> CloudIdentity:
        self.asked.append("identity")
        return self.acts_as

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        self.asked.append("list_owned")
        return [
            Instance(
                instance_id="i-0aaa", job_id=JOB_ID, cluster=JOB_ID, rank=0,
                private_ip="10.0.0.1", ssh_host="10.0.0.1", ssh_port=22, ssh_user="ubuntu",
                host_key="", interface="ens5", market="on-demand", instance_type="g5.xlarge",
                price_per_hour=Decimal("1.006"), launched_at=LAUNCHED, ledger_id=self.ledger_id,
            )
        ]  # fmt: skip

    def terminate(self, instance_ids: list[str]) -> datetime:
        self.terminated.append(sorted(instance_ids))
        return utcnow()


def running_job(ledger: Ledger, *, job: str | None, lease: str | None) -> None:
    """A RUNNING job with one open lease, each recorded as the identity JSON given."""
    ledger.add_job(
        Job(
            id=JOB_ID, name="owned", provider="aws", nodes=1, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=LAUNCHED, state=JobState.RUNNING,
            started_at=LAUNCHED, identity=job,
        )
    )  # fmt: skip
    ledger.open_lease(
        Lease(
            job_id=JOB_ID, cluster=JOB_ID, provider="aws", instance_id="i-0aaa", rank=0,
            market="on-demand", instance_type="g5.xlarge", price_per_hour=Decimal("1.006"),
            launched_at=LAUNCHED, identity=lease,
        )
    )  # fmt: skip


def cancel_as(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, identity: CloudIdentity
) -> tuple[Settings, Cloud]:
    cloud = Cloud(ledger.ledger_id, identity)
    monkeypatch.setattr(cancel_module, "get_provider", lambda name, settings: cloud)
    return Settings(home=tmp_path / "orch"), cloud


@pytest.mark.parametrize(
    "other",
    [
        CloudIdentity("aws", "123456789012", "us-west-2", None),  # another region
        CloudIdentity("aws", "123456789012", "us-east-1", "http://localhost:5000"),  # endpoint
        CloudIdentity("aws", "210987654321", "us-east-1", None),  # another account
    ],
)
def test_cancel_as_another_identity_refuses_naming_both_and_ends_nothing(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, other: CloudIdentity
) -> None:
    running_job(ledger, job=STARTED_AS.to_json(), lease=STARTED_AS.to_json())
    settings, cloud = cancel_as(tmp_path, ledger, monkeypatch, other)
    with pytest.raises(IdentityMismatch) as raised:
        cancel(settings, ledger, JOB_ID)
    message = str(raised.value)
    assert STARTED_AS.describe() in message and other.describe() in message
    assert "nothing was touched" in (raised.value.hint or "")
    assert cloud.terminated == [] and "list_owned" not in cloud.asked
    job = ledger.get_job(JOB_ID)
    assert job.state == JobState.RUNNING and job.ended_at is None and job.exit_code is None
    assert [lease.ended_at for lease in ledger.leases(JOB_ID)] == [None]
    assert [event.kind for event in ledger.events(JOB_ID)] == []
    lock = ControllerLock(settings, JOB_ID)  # released for the next try
    assert lock.acquire()
    lock.release()


def test_cancel_as_the_jobs_own_identity_ends_its_nodes(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    running_job(ledger, job=STARTED_AS.to_json(), lease=STARTED_AS.to_json())
    settings, cloud = cancel_as(tmp_path, ledger, monkeypatch, STARTED_AS)
    result = cancel(settings, ledger, JOB_ID)
    assert (result.route, result.state, result.terminated) == (
        CancelRoute.NO_CONTROLLER,
        JobState.CANCELLED,
        ("i-0aaa",),
    )
    assert cloud.terminated == [["i-0aaa"]]
    assert ledger.get_job(JOB_ID).state == JobState.CANCELLED


def test_an_identity_recorded_only_on_a_lease_is_checked_too(ledger: Ledger) -> None:
    """A node launched as an identity the job row does not name still binds the job to it."""
    running_job(ledger, job=None, lease=STARTED_AS.to_json())
    elsewhere = CloudIdentity("aws", "123456789012", "eu-west-1", None)
    with pytest.raises(IdentityMismatch) as raised:
        check_job_identity(ledger, JOB_ID, Cloud(ledger.ledger_id, elsewhere))  # type: ignore[arg-type]
    assert STARTED_AS.describe() in str(raised.value)
    assert elsewhere.describe() in str(raised.value)
    check_job_identity(ledger, JOB_ID, Cloud(ledger.ledger_id, STARTED_AS))  # type: ignore[arg-type]


def test_a_job_with_no_recorded_identity_is_not_checked(ledger: Ledger) -> None:
    """A job launched before identities were recorded: nothing to compare, the cloud is not
    even asked who it is."""
    running_job(ledger, job=None, lease=None)
    cloud = Cloud(ledger.ledger_id, CloudIdentity("aws", "000000000000", "us-east-1", None))
    check_job_identity(ledger, JOB_ID, cloud)  # type: ignore[arg-type]
    assert cloud.asked == []
