"""What a bucket finding means for a submit (pure): which refuse it, which only warn, whose
credentials decide it, and the words that name the field and what to do; and the dry run's
lines of a job's data (`control.verbs.data_check`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.cluster.bucket_check import BucketFinding, bucket_places
from orchestrator.control.verbs.data_check import DataCheck, LocalSource, measure_local
from orchestrator.spec.model import JobSpec

URL = "s3://bkt/a/b"


@pytest.mark.parametrize(
    ("outcome", "with_own", "without_own"),
    [
        ("found", "ok", "ok"),
        ("missing-bucket", "error", "error"),
        ("missing", "error", "error"),
        ("denied", "warning", "error"),
        ("no-credentials", "warning", "error"),
        ("unreachable", "warning", "warning"),
        ("unknown", "warning", "warning"),
    ],
)
def test_whose_credentials_the_nodes_use_decides_denied_and_no_credentials(
    outcome: str, with_own: str, without_own: str
) -> None:
    finding = BucketFinding("data[0].src", URL, outcome)  # type: ignore[arg-type]
    assert (finding.severity(True), finding.severity(False)) == (with_own, without_own)


@pytest.mark.parametrize(
    ("place", "outcome", "own", "said"),
    [
        ("data[0].src", "missing-bucket", False, "bucket bkt does not exist: check its name"),
        (
            "data[0].src", "missing", False,
            f"no object a/b and nothing under {URL}/: check the key or prefix (aws s3 ls {URL}/)",
        ),
        (
            "data[0].src", "denied", False,
            "which the nodes use too: grant them s3:GetObject and s3:ListBucket on it",
        ),
        (
            "outputs[0].dst", "denied", False,
            "which the nodes use too: grant them s3:ListBucket and s3:PutObject on it",
        ),
        ("data[0].src", "denied", True, "the nodes will try with their own instance role"),
        (
            "data[0].src", "no-credentials", False,
            "the nodes would use this machine's: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ),
        ("outputs[2].dst", "no-credentials", True, "try with their own instance role"),
        ("data[0].src", "unreachable", False, "the S3 endpoint is out of this machine's reach"),
        ("data[0].src", "unknown", True, "cannot tell whether it is there (SlowDown)"),
    ],
)  # fmt: skip
def test_each_message_names_the_field_the_url_and_what_to_do(
    place: str, outcome: str, own: bool, said: str
) -> None:
    finding = BucketFinding(place, URL, outcome, detail="SlowDown")  # type: ignore[arg-type]
    message = finding.message(own)
    assert message.startswith(f"{place} {URL}: ") and said in message, message


def test_a_whole_bucket_that_is_empty_says_so() -> None:
    said = BucketFinding("data[1].src", "s3://bkt", "missing").message(False)
    assert (
        said == "data[1].src s3://bkt: it is empty: check the key or prefix (aws s3 ls s3://bkt/)"
    )


def test_the_places_are_the_bucket_sources_then_the_outputs() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "n",
            "workdir": ".",
            "run": "r",
            "data": [{"src": "./d", "dst": "~/d"}, {"src": "s3://bkt/x/", "dst": "~/x"}],
            "outputs": [{"src": "~/o", "dst": "s3://out-1/r"}],
        }  # fmt: skip
    )
    assert bucket_places(spec) == [
        ("data[1].src", "s3://bkt/x"),
        ("outputs[0].dst", "s3://out-1/r"),
    ]


def test_a_dry_run_lists_every_source_and_output_with_what_was_found() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "n",
            "workdir": ".",
            "run": "r",
            "data": [
                {"src": "./d", "dst": "~/d"},
                {"src": "s3://bkt/x", "dst": "~/x"},
                {"src": "s3://bkt/y", "dst": "~/y"},
            ],
            "outputs": [{"src": "~/o", "dst": "s3://out-1/r", "nodes": "all"}],
        }  # fmt: skip
    )
    check = DataCheck(
        local=(LocalSource("data[0].src", "/p/d", 100_000, 5 * 10**9, at_least=True),),
        buckets=(
            BucketFinding("data[1].src", "s3://bkt/x", "found", "prefix", 100_000, 7 * 10**9, True),
            BucketFinding("data[2].src", "s3://bkt/y", "denied"),
            BucketFinding("outputs[0].dst", "s3://out-1/r", "found", "bucket"),
        ),
        nodes_have_credentials=True,
    )
    assert check.lines(spec) == [
        "data[0] ./d -> ~/d: at least 100000 file(s), at least 5.0 GB",
        "data[1] s3://bkt/x -> ~/x: at least 100000 object(s), at least 7.0 GB",
        "data[2] s3://bkt/y -> ~/y: denied (see below)",
        "outputs[0] ~/o -> s3://out-1/r (every node, under node-<rank>/): the bucket exists",
    ]
    assert check.errors() == []
    (warning,) = check.warnings()
    assert warning.startswith("data[2].src s3://bkt/y: access denied")
    document = check.as_dict()
    assert [b["severity"] for b in document["buckets"]] == ["ok", "warning", "ok"]
    assert document["local"][0]["at_least"] is True


def test_a_local_source_is_measured_without_following_links_and_within_its_bound(
    tmp_path: Path,
) -> None:
    source = tmp_path / "d"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(b"a" * 10)
    (source / "sub" / "b.bin").write_bytes(b"b" * 20)
    os.symlink("/etc/passwd", source / "link")
    os.symlink(tmp_path, source / "loop")
    assert measure_local("data[0].src", source) == LocalSource("data[0].src", str(source), 2, 30)
    bounded = measure_local("data[0].src", source, max_files=1)
    assert (bounded.files, bounded.at_least) == (1, True)
    assert measure_local("data[1].src", source / "a.bin").bytes == 10
