"""A job that reads bucket data or writes outputs asks for nodes with credentials of their own
(an instance role on AWS), never for the user's keys on its nodes; local data asks nothing."""

from __future__ import annotations

import pytest

from orchestrator.providers.aws.node_launcher import needs_role
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec


@pytest.mark.parametrize(
    ("sections", "buckets"),
    [
        ({}, False),
        ({"data": [{"src": "./local", "dst": "~/local"}]}, False),
        ({"data": [{"src": "s3://sets/imagenet", "dst": "~/imagenet"}]}, True),
        ({"outputs": [{"src": "~/out", "dst": "s3://results/run"}]}, True),
    ],
)
def test_bucket_data_and_outputs_ask_for_nodes_with_a_role(sections: dict, buckets: bool) -> None:
    fields = {"name": "j", "workdir": ".", "run": "python train.py", **sections}
    spec = JobSpec.model_validate(fields)
    request = launch_request(spec, "job-1")
    assert request.buckets is buckets
    assert needs_role(request) is buckets
