"""The default spend guard: which submits ask before launching, and what they show."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.control.money.spend_guard import needs_confirmation
from orchestrator.errors import ConfigError
from orchestrator.providers.plan import LaunchPlan, local_plan
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec


def spec(**budget: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "guard", "workdir": ".", "run": "python train.py", "budget": budget,
         "resources": {"nodes": 2, "gpus_per_node": 4}}
    )  # fmt: skip


def aws_plan(job: JobSpec) -> LaunchPlan:
    return LaunchPlan(
        provider="aws", nodes=2, gpus_per_node=4, market="on-demand",
        instance_type="g5.12xlarge", price_per_node_hour=Decimal("5.672"),
        max_runtime_s=job.budget.max_runtime, max_cost_usd=job.budget.max_cost_usd,
    )  # fmt: skip


def test_a_paid_provider_without_a_budget_shows_the_hourly_price_and_asks() -> None:
    job = spec()
    notice = needs_confirmation(job, aws_plan(job))
    assert notice is not None
    text = notice.text()
    assert "2 x g5.12xlarge (on-demand) on aws" in text
    assert "$5.672/node-hour" in text and "$11.344/h" in text


@pytest.mark.parametrize("budget", [{"max_cost_usd": 20}, {"max_runtime": "4h"}])
def test_a_spend_or_runtime_cap_needs_no_question(budget: dict) -> None:
    job = spec(**budget)
    assert needs_confirmation(job, aws_plan(job)) is None


def test_local_nodes_bill_nobody_and_need_no_question() -> None:
    job = spec()
    assert (
        needs_confirmation(
            job,
            local_plan(launch_request(job, "guard"), job.budget, Decimal("0.5"), Decimal("0.2")),
        )
        is None
    )


def test_a_fleet_priced_at_nothing_needs_no_question_and_one_with_a_price_asks() -> None:
    job = spec()
    free = LaunchPlan(
        provider="ssh", nodes=2, gpus_per_node=4, market="on-demand", instance_type="fleet lab",
        price_per_node_hour=Decimal(0), max_runtime_s=None, max_cost_usd=None,
    )  # fmt: skip
    assert needs_confirmation(job, free) is None
    priced = needs_confirmation(job, replace(free, price_per_node_hour=Decimal("2")))
    assert priced is not None and "fleet lab" in priced.text()


def test_the_default_max_runtime_is_a_duration_setting(tmp_path: Path) -> None:
    home = {"ORCH_HOME": str(tmp_path)}
    assert load_settings(home).controller.default_max_runtime is None
    settings = load_settings({**home, "ORCH_DEFAULT_MAX_RUNTIME": "1h30m"})
    assert settings.controller.default_max_runtime == 5400
    with pytest.raises(ConfigError, match="default_max_runtime"):
        load_settings({**home, "ORCH_DEFAULT_MAX_RUNTIME": "soon"})
