"""The IAM policies of infra/policies/*.json.tftpl, rendered here as Terraform's `templatefile`
renders them, so that tests evaluate the very statements infra/ applies.

Only the template syntax those files use is understood: `${jsonencode(name)}` and `$${` (a
literal `${`, an IAM policy variable); anything else raises."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
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


def _bucket_and_prefix(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket[/prefix][/]`, as infra/store.tf's regex splits it."""
    found = re.fullmatch(r"s3://([^/]+)/?(.*?)/?", url)
    if found is None:
        raise ValueError(f"not an s3:// URL: {url}")
    return found.group(1), found.group(2)


def data_statements(
    data_sources: Sequence[str] = (), output_destinations: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The nodes' statements for infra's `data_sources` and `output_destinations` as
    infra/store.tf puts them together (`local.data_statements`); empty without either."""
    reads = [_bucket_and_prefix(url) for url in dict.fromkeys(data_sources)]
    writes = [_bucket_and_prefix(url) for url in dict.fromkeys(output_destinations)]
    data_objects = [
        arn
        for bucket, prefix in reads
        for arn in (
            [f"arn:aws:s3:::{bucket}/{prefix}", f"arn:aws:s3:::{bucket}/{prefix}/*"]
            if prefix
            else [f"arn:aws:s3:::{bucket}/*"]
        )
    ]
    output_objects = [
        f"arn:aws:s3:::{bucket}/{prefix}/*" if prefix else f"arn:aws:s3:::{bucket}/*"
        for bucket, prefix in writes
    ]
    both = render(
        "node-data",
        data_objects=list(dict.fromkeys(data_objects)),
        output_objects=list(dict.fromkeys(output_objects)),
    )
    statements = [s for s in both["Statement"] if s["Resource"]]
    listing: dict[str, list[str]] = {}
    for bucket, prefix in reads:
        listing.setdefault(bucket, []).append(f"{prefix}/*" if prefix else "*")
    for i, bucket in enumerate(sorted(listing)):
        one = render(
            "node-data-list",
            sid=f"ListDataSources{i}",
            bucket_arn=f"arn:aws:s3:::{bucket}",
            list_prefixes=list(dict.fromkeys(listing[bucket])),
        )
        statements += one["Statement"]
    return statements


def node_job_policy(
    *,
    job_objects: str,
    job_list_prefix: str,
    store_bucket_arn: str,
    data_sources: Sequence[str] = (),
    output_destinations: Sequence[str] = (),
) -> dict[str, Any]:
    """The per-job node policy (also its role's permissions boundary) as infra/store.tf makes
    it: node-job.json.tftpl as it is, followed by the data statements when there are any."""
    policy = render(
        "node-job",
        job_objects=job_objects,
        job_list_prefix=job_list_prefix,
        store_bucket_arn=store_bucket_arn,
    )
    extra = data_statements(data_sources, output_destinations)
    if not extra:
        return policy
    return {"Version": "2012-10-17", "Statement": policy["Statement"] + extra}
