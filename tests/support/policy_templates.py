"""The IAM policies of infra/policies/*.json.tftpl, rendered here as Terraform's `templatefile`
renders them, so that tests evaluate the very statements infra/ applies.

Only the template syntax those files use is understood: `${jsonencode(name)}` and `$${` (a
literal `${`, an IAM policy variable); anything else raises."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

POLICIES = Path(__file__).resolve().parents[2] / "infra" / "policies"
_PLACE = re.compile(r"(?<!\$)\$\{([^}]*)\}|%\{")


def render(name: str, **variables: Any) -> dict[str, Any]:
    """The policy document of `infra/policies/<name>.json.tftpl` with `variables`."""
    text = (POLICIES / f"{name}.json.tftpl").read_text()

    def value(found: re.Match[str]) -> str:
        inner = found.group(1)
        call = re.fullmatch(r"jsonencode\((\w+)\)", inner or "")
        if call is None:
            raise ValueError(f"{name}: template syntax not understood here: {found.group(0)}")
        return json.dumps(variables[call.group(1)])

    rendered = _PLACE.sub(value, text).replace("$${", "${")
    return json.loads(rendered)


def controller_policy(
    *, owner: str, vpc_arn: str, store: dict[str, str] | None = None
) -> dict[str, Any]:
    """The controller host's role policy as infra/controller.tf puts it together: its own
    statements, and the store's when `store` (node_role_arn, node_job_policy_arn, store_objects,
    store_bucket_arn, store_list_prefix) is given."""
    parts = [render("controller", owner=owner, vpc_arn=vpc_arn)]
    if store is not None:
        parts.append(render("controller-store", owner=owner, **store))
    return {"Version": "2012-10-17", "Statement": [s for p in parts for s in p["Statement"]]}
