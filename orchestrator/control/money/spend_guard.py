"""Pure: the default spend guard of `orch submit` on a paid provider.

A job with neither `budget.max_cost_usd` nor `budget.max_runtime` has nothing but its own end
to stop it billing. On a paid provider (every one but `local`, whose prices are pretend) submit
then shows what the planned nodes cost per hour and asks before it launches; `--yes` answers
for scripts, and `controller.default_max_runtime` (ORCH_DEFAULT_MAX_RUNTIME) gives such jobs a
max_runtime instead, so nothing is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.providers.plan import LaunchPlan
from orchestrator.spec.model import JobSpec

FREE_PROVIDERS = frozenset({"local"})  # providers whose prices bill nobody


@dataclass(frozen=True)
class SpendNotice:
    """Why submit asks before launching: the plan of a job with no spending limit."""

    plan: LaunchPlan  # the first offer the launch tries, as in the dry run

    def text(self) -> str:
        plan = self.plan
        return (
            f"job has no budget (budget.max_cost_usd, budget.max_runtime): {plan.nodes} x "
            f"{plan.instance_type} ({plan.market}) on {plan.provider} at "
            f"${plan.price_per_node_hour}/node-hour bill ${plan.hourly_usd}/h until the job "
            "ends"
        )


def needs_confirmation(spec: JobSpec, plan: LaunchPlan) -> SpendNotice | None:
    """The notice to confirm before launching `spec` as `plan`, or None when nothing need be
    asked: a free provider, or a job with a spend cap or a runtime cap (the settings' default
    `controller.default_max_runtime` is applied to the spec before this is asked), or nodes
    priced at nothing (a fleet of the user's own machines with no price given)."""
    if plan.provider in FREE_PROVIDERS or plan.price_per_node_hour == 0:
        return None
    budget = spec.budget
    if budget.max_cost_usd is not None or budget.max_runtime is not None:
        return None
    return SpendNotice(plan)
