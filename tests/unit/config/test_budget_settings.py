"""The `budget` section of ORCH_HOME/config.yaml and its ORCH_BUDGET_* variables."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ConfigError


def test_the_caps_are_exact_decimals_from_the_file_or_the_variables(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("budget: {monthly_usd: 0.1, user_monthly_usd: 40}\n")
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    assert settings.budget.monthly_usd == Decimal("0.1")  # not 0.1000000000000000055...
    assert settings.budget.user_monthly_usd == 40 and settings.budget.capped
    overridden = load_settings(
        {"ORCH_HOME": str(tmp_path), "ORCH_BUDGET_MONTHLY_USD": "2500.50",
         "ORCH_BUDGET_USER_MONTHLY_USD": "300"}
    )  # fmt: skip
    assert overridden.budget.monthly_usd == Decimal("2500.50")
    assert overridden.budget.user_monthly_usd == 300


def test_no_cap_by_default_and_a_blank_one_is_none(tmp_path: Path) -> None:
    assert not load_settings({"ORCH_HOME": str(tmp_path)}).budget.capped
    (tmp_path / "config.yaml").write_text("budget:\n  monthly_usd:\n")
    assert load_settings({"ORCH_HOME": str(tmp_path)}).budget.monthly_usd is None


@pytest.mark.parametrize("value", ["0", "-5", "nan", "Infinity", "lots"])
def test_a_cap_that_is_not_a_positive_amount_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"ORCH_HOME": str(tmp_path), "ORCH_BUDGET_MONTHLY_USD": value})
    assert "budget.monthly_usd" in str(refused.value)
    assert refused.value.exit_code == 2
