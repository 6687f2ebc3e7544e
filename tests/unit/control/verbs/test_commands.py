"""The command functions of `control` (submit's preparation, cancel, down) and what they return,
the providers' dry-run plans, and the one spec -> LaunchRequest builder. No sshd: nodes are
those of a recording provider, AWS is moto in this process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cli.console import revived_line
from orchestrator.config import AwsSettings, ControllerSettings, LocalSettings, Settings
from orchestrator.control.process.controllers import (
    ControllerLock,
    refused_by_last_controller,
    revive_controllers,
)
from orchestrator.control.verbs import cancel as cancel_module
from orchestrator.control.verbs import commands
from orchestrator.control.verbs.cancel import CancelRoute, cancel
from orchestrator.errors import CapacityError, OrchError, SpecError, UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine
from orchestrator.providers.base import CloudIdentity, Instance, LaunchRequest
from orchestrator.providers.plan import local_plan
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import Budget, JobSpec
from orchestrator.spot.driver import price_request

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job_spec(**sections: object) -> JobSpec:
    return JobSpec.model_validate({"name": "cmd", "workdir": ".", "run": "true", **sections})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


@pytest.fixture
def ledger(settings: Settings) -> Ledger:
    settings.home.mkdir(parents=True, exist_ok=True)
    return Ledger(make_engine(settings.db_path))


def add_job(ledger: Ledger, job_id: str, state: JobState = JobState.RUNNING) -> Job:
    return ledger.add_job(
        Job(id=job_id, name="cmd", state=state, provider="fake", nodes=2, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=NOW)
    )  # fmt: skip


def node(instance_id: str, job_id: str, ledger_id: str | None, rank: int = 0) -> Instance:
    return Instance(
        instance_id=instance_id, job_id=job_id, cluster=job_id, rank=rank,
        private_ip="10.0.0.1", ssh_host="127.0.0.1", ssh_port=22, ssh_user="orch",
        host_key="ssh-ed25519 AAAA", interface="lo", market="on-demand",
        instance_type="fake-1x", price_per_hour=Decimal("1"), launched_at=NOW,
        ledger_id=ledger_id,
    )  # fmt: skip


def lease(instance: Instance) -> Lease:
    return Lease(
        job_id=instance.job_id, cluster=instance.cluster, provider="fake",
        instance_id=instance.instance_id, rank=instance.rank, market=instance.market,
        instance_type=instance.instance_type, price_per_hour=instance.price_per_hour,
        launched_at=instance.launched_at,
    )  # fmt: skip


@dataclass
class RecordingProvider:
    """A provider whose nodes are a list: `terminate` removes them and records the call."""

    nodes: list[Instance]
    name: str = "fake"
    terminated: list[list[str]] = field(default_factory=list)
    ended_at: datetime = NOW + timedelta(hours=1)

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        return [n for n in self.nodes if job_id is None or n.job_id == job_id]

    def terminate(self, instance_ids: list[str]) -> datetime:
        self.terminated.append(list(instance_ids))
        self.nodes = [n for n in self.nodes if n.instance_id not in instance_ids]
        return self.ended_at

    def identity(self) -> CloudIdentity:
        return CloudIdentity(provider="fake", account="me")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingProvider]:
    provider = RecordingProvider(nodes=[])
    monkeypatch.setattr(cancel_module, "get_provider", lambda name, settings: provider)
    monkeypatch.setattr(commands, "providers_in_use", lambda settings, ledger: [provider])
    yield provider


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_of_an_unknown_job_is_unknown_job(settings: Settings, ledger: Ledger) -> None:
    with pytest.raises(UnknownJob):
        cancel(settings, ledger, "nobody-000000")


def test_cancel_of_a_finished_job_changes_nothing(
    settings: Settings, ledger: Ledger, fake: RecordingProvider
) -> None:
    add_job(ledger, "done-1", JobState.SUCCEEDED)
    result = cancel(settings, ledger, "done-1")
    assert result.route is CancelRoute.ALREADY_ENDED and result.state is JobState.SUCCEEDED
    assert f"{result.state}" == "SUCCEEDED"  # as `orch cancel` prints it
    assert ledger.get_job("done-1").state == JobState.SUCCEEDED and not fake.terminated


def test_cancel_without_a_controller_ends_its_own_nodes_and_records_the_end(
    settings: Settings, ledger: Ledger, fake: RecordingProvider
) -> None:
    add_job(ledger, "run-1")
    ours = [node("n-0", "run-1", ledger.ledger_id, 0), node("n-1", "run-1", ledger.ledger_id, 1)]
    foreign = node("x-0", "run-1", "another-ledger")
    fake.nodes = [*ours, foreign]
    for instance in ours:
        ledger.open_lease(lease(instance))
    result = cancel(settings, ledger, "run-1")
    assert result.route is CancelRoute.NO_CONTROLLER and result.state is JobState.CANCELLED
    assert sorted(result.terminated) == ["n-0", "n-1"]
    assert fake.terminated == [["n-0", "n-1"]]  # another ledger's node is never ended
    job = ledger.get_job("run-1")
    assert job.state == JobState.CANCELLED and job.exit_code == 130 and job.reason == "cancelled"
    assert not ledger.leases("run-1", open_only=True)  # billing stopped at the provider's end
    assert ledger.get_job("run-1").ended_at is not None
    assert ControllerLock(settings, "run-1").acquire()  # the lock was given back


def test_cancel_without_a_controller_or_nodes_still_records_the_end(
    settings: Settings, ledger: Ledger, fake: RecordingProvider
) -> None:
    add_job(ledger, "run-2", JobState.PENDING)
    result = cancel(settings, ledger, "run-2")
    assert result.route is CancelRoute.NO_CONTROLLER and result.terminated == ()
    assert fake.terminated == [] and ledger.get_job("run-2").state == JobState.CANCELLED


def test_cancel_refuses_a_lock_held_by_no_orch_process(
    settings: Settings, ledger: Ledger, fake: RecordingProvider
) -> None:
    add_job(ledger, "run-3")
    fake.nodes = [node("n-0", "run-3", ledger.ledger_id)]
    held = ControllerLock(settings, "run-3")
    assert held.acquire()  # held by this pytest process, which is no orch controller
    try:
        with pytest.raises(OrchError, match="names no live process"):
            cancel(settings, ledger, "run-3", pid_wait_s=0.2)
    finally:
        held.release()
    assert ledger.get_job("run-3").state == JobState.RUNNING and not fake.terminated


# --- down -----------------------------------------------------------------------------------


def test_down_ends_this_ledgers_nodes_of_the_cluster_and_lists_the_others(
    settings: Settings, ledger: Ledger, fake: RecordingProvider
) -> None:
    add_job(ledger, "a-1")
    add_job(ledger, "b-1")
    fake.nodes = [
        node("a-n0", "a-1", ledger.ledger_id),
        node("b-n0", "b-1", ledger.ledger_id),
        node("a-x0", "a-1", "another-ledger"),
    ]
    heard: list[commands.NodesEnded] = []
    result = commands.down(settings, ledger, "a-1", on_ended=heard.append)
    assert result.ended == (commands.NodesEnded("a-1", "fake", ("a-n0",)),)
    assert heard == list(result.ended) and result.nodes == 1
    assert result.not_ours == ("a-x0",)
    assert fake.terminated == [["a-n0"]]
    assert ledger.get_job("a-1").state == JobState.CANCELLED  # no controller drove it
    assert ledger.get_job("a-1").reason == "orch down"
    assert ledger.get_job("b-1").state == JobState.RUNNING


def test_down_all_with_nothing_running_ends_nothing(
    settings: Settings, ledger: Ledger, fake: RecordingProvider
) -> None:
    result = commands.down(settings, ledger, None)
    assert result.ended == () and result.not_ours == () and result.nodes == 0
    assert "no running cluster 'gone'" in str(commands.cluster_not_found("gone"))


# --- supervision ----------------------------------------------------------------------------


def test_revive_controllers_limited_to_given_jobs_skips_final_and_unrecorded(
    settings: Settings, ledger: Ledger
) -> None:
    add_job(ledger, "fin-1", JobState.FAILED)
    add_job(ledger, "norec-1")  # no job.json: a submit died before writing it
    assert revive_controllers(settings, ledger, ["fin-1", "norec-1"]) == []
    with pytest.raises(UnknownJob):
        revive_controllers(settings, ledger, ["nobody-1"])


def test_a_revived_job_whose_last_controller_refused_it_says_why(ledger: Ledger) -> None:
    add_job(ledger, "ref-1")
    assert refused_by_last_controller(ledger, "ref-1") is None  # no event at all
    why = "job ref-1 was started as account 1 in us-east-1, but this controller acts as ..."
    ledger.add_event("ref-1", "REFUSED", why)
    assert refused_by_last_controller(ledger, "ref-1") == why
    line = revived_line("ref-1", refused_by_last_controller(ledger, "ref-1"))
    assert "refused the job: " + why in line and "shell that started the job" in line
    assert "adopted" not in line
    ledger.add_event("ref-1", "RUNNING", "adopted")  # the right controller took it since
    assert refused_by_last_controller(ledger, "ref-1") is None
    assert revived_line("ref-1", None) == (
        "orch: the controller of ref-1 was gone; a new one adopted the job"
    )


# --- the launch request and the dry-run plans -----------------------------------------------


def test_launch_request_carries_every_resource_of_the_spec() -> None:
    spec = job_spec(
        resources={"nodes": 3, "gpus_per_node": 2, "accelerator": "A10G", "spot": "auto",
                   "max_price_per_hour": 2.5, "min_gpu_memory_gb": 20, "disk_size_gb": 200},
        checkpoint={"store": "s3://bucket/ckpt"},
    )  # fmt: skip
    request = launch_request(spec, "cmd-1", public_key="ssh-ed25519 K", attempt=2)
    assert (request.job_id, request.cluster, request.count, request.gpus_per_node) == (
        "cmd-1", "cmd-1", 3, 2,
    )  # fmt: skip
    assert request.spot == "auto" and request.accelerator == "A10G"
    assert request.max_price_per_hour == Decimal("2.5") and request.min_gpu_memory_gb == 20
    assert request.disk_size_gb == 200 and request.store == "s3://bucket/ckpt"
    assert request.public_key == "ssh-ed25519 K" and request.attempt == 2
    assert launch_request(spec, "cmd-1", spot=False).spot is False  # a spot policy's choice
    priced = price_request("cmd-1", spec)
    assert priced.spot == "auto" and priced.count == 3 and priced.accelerator == "A10G"


def test_local_plan_prices_the_market_and_the_runtime(tmp_path: Path) -> None:
    from orchestrator.providers.local.provider import LocalProvider

    local = LocalSettings(price_per_hour=Decimal("0.9"), spot_price_per_hour=Decimal("0.3"))
    provider = LocalProvider(Settings(home=tmp_path, local=local))
    spec = job_spec(resources={"nodes": 2, "spot": True}, budget={"max_runtime": "2h"})
    dry = provider.plan(launch_request(spec, "cmd"), spec.budget)
    assert dry.plan.market == "spot" and dry.plan.price_per_node_hour == Decimal("0.3")
    assert dry.plan.hourly_usd == Decimal("0.6") and dry.plan.cost_at_max_runtime == Decimal("1.2")
    assert dry.document == {"provider": "local", "plan": dry.plan.as_dict(), "placement": {}}
    on_demand = provider.plan(launch_request(spec, "cmd", spot=False), spec.budget)
    assert on_demand.plan.market == "on-demand" and on_demand.plan.price_per_node_hour == Decimal(
        "0.9"
    )


@pytest.fixture
def aws_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    from moto import mock_aws

    for var in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        yield Settings(home=tmp_path, aws=AwsSettings(regions=["us-east-1"], max_api_attempts=1))


def test_aws_plan_picks_the_cheapest_fitting_offer(aws_settings: Settings) -> None:
    from orchestrator.providers.aws.provider import AwsProvider

    spec = job_spec(
        resources={"nodes": 2, "gpus_per_node": 4, "accelerator": "A10G", "spot": False},
        budget={"max_runtime": "2h"},
    )
    dry = AwsProvider(aws_settings).plan(launch_request(spec, "cmd"), spec.budget)
    assert dry.plan.instance_type == "g5.12xlarge" and dry.plan.market == "on-demand"
    assert dry.plan.hourly_usd == 2 * Decimal("5.672")
    document = json.loads(json.dumps(dry.document))
    assert document["plan"] == json.loads(json.dumps(dry.plan.as_dict()))
    assert document["chosen"]["instance_type"] == "g5.12xlarge"
    prices = [Decimal(offer["price_per_hour"]) for offer in document["offers"]]
    assert prices == sorted(prices) and document["offers_total"] >= len(prices)


def test_aws_plan_without_a_fitting_offer_is_a_capacity_error(aws_settings: Settings) -> None:
    from orchestrator.providers.aws.provider import AwsProvider

    spec = job_spec(resources={"accelerator": "A10G", "max_price_per_hour": 0.01, "spot": False})
    with pytest.raises(CapacityError, match="no AWS offer fits"):
        AwsProvider(aws_settings).plan(launch_request(spec, "cmd"), spec.budget)


# --- submit's preparation -------------------------------------------------------------------


def write_job(directory: Path, extra: str = "") -> Path:
    (directory / "work").mkdir(exist_ok=True)
    path = directory / "job.yaml"
    path.write_text(f"name: cmd\nworkdir: work\nrun: python train.py\n{extra}")
    return path


def test_prepare_submit_applies_flags_and_the_default_runtime(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path / "home",
        local=LocalSettings(price_per_hour=Decimal("1")),
        controller=ControllerSettings(default_max_runtime=3600),
    )
    prepared = commands.prepare_submit(
        settings, write_job(tmp_path), {"resources.nodes": 3, "resources.spot": None}
    )
    assert prepared.loaded.spec.resources.nodes == 3
    assert prepared.loaded.spec.budget.max_runtime == 3600
    assert prepared.provider.name == "local" and prepared.plan.nodes == 3
    assert prepared.plan.cost_at_max_runtime == Decimal("3")
    assert not settings.db_path.exists()  # nothing registered


def test_prepare_submit_refuses_a_deadline_already_passed(tmp_path: Path) -> None:
    path = write_job(tmp_path, "deadline: 2026-01-01T00:00:00Z\n")
    with pytest.raises(SpecError, match="has already passed"):
        commands.prepare_submit(
            Settings(home=tmp_path / "home"), path, {}, now=NOW + timedelta(hours=1)
        )


def test_the_hourly_cap_refuses_a_plan_above_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", local=LocalSettings(price_per_hour=Decimal("2")))
    path = write_job(tmp_path, "resources: {nodes: 2}\nbudget: {max_hourly_usd: 3}\n")
    prepared = commands.prepare_submit(settings, path, {})
    with pytest.raises(SpecError, match=r"\$4/h, above budget.max_hourly_usd \$3/h"):
        commands.check_hourly_cap(prepared)
    cheap = write_job(tmp_path, "resources: {nodes: 1}\nbudget: {max_hourly_usd: 3}\n")
    commands.check_hourly_cap(commands.prepare_submit(settings, cheap, {}))  # within: no error


def test_a_local_plan_names_the_cloud_fields_it_leaves_aside_and_the_ports() -> None:
    """A spec written for AWS, rehearsed on local nodes: the dry run says what it ignores."""
    request = LaunchRequest(
        job_id="j", cluster="j", count=2, gpus_per_node=1, public_key="",
        regions=("us-east-1",), instance_types=("g5.xlarge",), ports=("6006",),
    )  # fmt: skip
    plan = local_plan(request, Budget(), Decimal("0.5"), Decimal("0.3"))
    assert plan.notes == (
        "ports 6006: reachable from this machine only",
        "ignored on local nodes: resources.instance_type, resources.region",
    )
