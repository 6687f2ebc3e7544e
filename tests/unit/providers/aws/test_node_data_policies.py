"""The nodes' grants on the jobs' bucket data and outputs (infra's `data_sources` and
`output_destinations`), as infra/policies/ renders them into each job's node policy (also its
role's permissions boundary) and the shared node role's data policy, evaluated offline: a node
reads its sources and writes under its outputs, and nothing beside them. That infra/ applies
these very statements: scripts/infra_test.sh."""

from __future__ import annotations

import json

import pytest

from tests.support.iam_eval import Request, allows
from tests.support.policy_templates import data_statements, node_job_policy, render

JOB = {
    "job_objects": "arn:aws:s3:::ckpt/team/${aws:PrincipalTag/orch-job}/*",
    "job_list_prefix": "team/${aws:PrincipalTag/orch-job}/*",
    "store_bucket_arn": "arn:aws:s3:::ckpt",
}
SOURCES = ["s3://train/sets/imagenet", "s3://train/vocab.txt/", "s3://shared-all"]
OUTPUTS = ["s3://results/runs", "s3://logs-bucket"]
TAG = {"aws:PrincipalTag/orch-job": "job1"}
WRITES = ("s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")


def _policies() -> dict[str, dict]:
    """Each policy a node may hold: its job's own, and the shared role's data policy."""
    shared = {"Version": "2012-10-17", "Statement": data_statements(SOURCES, OUTPUTS)}
    own = node_job_policy(**JOB, data_sources=SOURCES, output_destinations=OUTPUTS)
    return {"per-job": own, "shared": shared}


def _get(policy: dict, key: str) -> bool:
    bucket, _, name = key.partition("/")
    return allows(policy, Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{name}", TAG))


def _list(policy: dict, bucket: str, prefix: str | None) -> bool:
    """ListObjectsV2 of `bucket` with `prefix` (None: the request names none)."""
    context = dict(TAG) if prefix is None else {**TAG, "s3:prefix": prefix}
    return allows(policy, Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", context))


@pytest.mark.parametrize("which", ["per-job", "shared"])
def test_a_node_reads_its_data_sources_and_nothing_beside_them(which: str) -> None:
    policy = _policies()[which]
    # a prefix: the object it names, every object under it, and its listing (as the node asks)
    assert _get(policy, "train/sets/imagenet/train/00001.tar")
    assert _get(policy, "train/sets/imagenet")
    assert _list(policy, "train", "sets/imagenet/")
    assert _get(policy, "train/vocab.txt")  # a single object, its URL written with a '/'
    outside = ("train/sets/imagenet-extra/x", "train/sets/other", "train/sets/x", "train/secret",
               "other/sets/imagenet/x", "results/runs/x", "ckpt/team/job2/x")  # fmt: skip
    for key in outside:
        assert not _get(policy, key), key
    for prefix in ("", "sets/", "sets/imagenet-extra/", "sets/imagenet", "secret/", None):
        assert not _list(policy, "train", prefix), prefix
    assert not _list(policy, "other", "sets/imagenet/")
    # a whole bucket: any of its objects and its whole listing
    assert _get(policy, "shared-all/a/b.bin") and _list(policy, "shared-all", "")
    assert not _list(policy, "shared-all-2", "")
    # read only: sources are never written or deleted
    for action in (*WRITES, "s3:DeleteObject"):
        resource = "arn:aws:s3:::train/sets/imagenet/x"
        assert not allows(policy, Request(action, resource, TAG)), action


@pytest.mark.parametrize("which", ["per-job", "shared"])
def test_a_node_writes_under_its_output_destinations_only(which: str) -> None:
    policy = _policies()[which]

    def may(action: str, key: str) -> bool:
        return allows(policy, Request(action, f"arn:aws:s3:::{key}", TAG))

    for action in WRITES:
        assert may(action, "results/runs/node-0/model.pt"), action
        assert may(action, "logs-bucket/anything/at/all"), action
        for key in ("results/runs-old/x", "results/other/x", "results/runs", "other/runs/x",
                    "train/sets/imagenet/x", "ckpt/team/job2/x"):  # fmt: skip
            assert not may(action, key), (action, key)
    # outputs are written, never read back, listed or deleted
    assert not may("s3:GetObject", "results/runs/node-0/model.pt")
    assert not may("s3:DeleteObject", "results/runs/node-0/model.pt")
    assert not _list(policy, "results", "runs/")


def test_a_listed_prefix_covers_the_urls_under_it() -> None:
    """A job's `s3://train/sets/imagenet/val` is read, and `s3://results/runs/exp-1` written,
    with the grants of the listed prefixes above them."""
    policy = _policies()["per-job"]
    assert _get(policy, "train/sets/imagenet/val")  # the node's first look: is it one object?
    assert _list(policy, "train", "sets/imagenet/val/")
    assert _get(policy, "train/sets/imagenet/val/00001.tar")
    resource = "arn:aws:s3:::results/runs/exp-1/node-0/model.pt"
    assert allows(policy, Request("s3:PutObject", resource, TAG))


def test_a_job_s_own_role_still_reaches_only_its_job_s_checkpoints() -> None:
    policy = _policies()["per-job"]
    for action in ("s3:GetObject", "s3:PutObject"):
        assert allows(policy, Request(action, "arn:aws:s3:::ckpt/team/job1/ckpt.pt", TAG))
        assert not allows(policy, Request(action, "arn:aws:s3:::ckpt/team/job2/ckpt.pt", TAG))


def test_without_data_sources_or_outputs_the_node_policies_are_as_before() -> None:
    assert data_statements() == []
    before = render("node-job", **JOB)
    assert node_job_policy(**JOB) == before
    # with them, the job's own statements come first, unchanged
    with_data = node_job_policy(**JOB, data_sources=SOURCES)["Statement"]
    assert with_data[: len(before["Statement"])] == before["Statement"]
    # only the statements a list needs: sources alone grant no write, outputs alone no read
    assert {s["Sid"] for s in data_statements(SOURCES)} == {
        "ReadDataSources", "ListDataSources0", "ListDataSources1"}  # fmt: skip
    assert {s["Sid"] for s in data_statements(output_destinations=OUTPUTS)} == {
        "WriteOutputDestinations"
    }


def test_one_listing_statement_per_bucket_and_no_repeats() -> None:
    """Two buckets' prefixes in one statement would let each bucket be listed under the other's
    prefix: each bucket gets its own."""
    statements = data_statements(["s3://a-bucket/x", "s3://b-bucket/y", "s3://a-bucket/x/"])
    listing = {s["Resource"]: s["Condition"]["StringLike"]["s3:prefix"]
               for s in statements if s["Action"] == "s3:ListBucket"}  # fmt: skip
    assert listing == {"arn:aws:s3:::a-bucket": ["x/*"], "arn:aws:s3:::b-bucket": ["y/*"]}
    sids = [s["Sid"] for s in statements]
    assert len(sids) == len(set(sids)), "IAM wants each Sid once in a policy"


def test_ten_sources_and_ten_outputs_fit_a_managed_policy() -> None:
    """IAM refuses a managed policy over 6,144 characters (whitespace not counted): the
    per-job policy with ten sources and ten outputs of typical length stays under it."""
    sources = [f"s3://team-training-data-{i}/datasets/imagenet-2012/train" for i in range(10)]
    outputs = [f"s3://team-training-results-{i}/experiments/resnet-50" for i in range(10)]
    policy = node_job_policy(**JOB, data_sources=sources, output_destinations=outputs)
    assert len(json.dumps(policy, separators=(",", ":"))) < 6144
