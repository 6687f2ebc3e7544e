"""Bucket sources in `data`, and `outputs`: what the spec takes, how it normalizes it, what it
refuses and what a loaded job holds for each."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from orchestrator.spec.loading import load_job
from orchestrator.spec.model import DataMount, JobSpec, OutputMount
from orchestrator.spec.mounts import bucket_url, split_bucket_url
from tests.unit.spec_cases import MINIMAL, spec_error, write

HOME = PurePosixPath("/home/u")


@pytest.mark.parametrize(
    ("written", "normalized"),
    [
        ("s3://my-bucket", "s3://my-bucket"),
        ("s3://my-bucket/", "s3://my-bucket"),
        ("s3://my-bucket/imagenet/train/", "s3://my-bucket/imagenet/train"),
        ("s3://my.bucket-1/a/b.tar", "s3://my.bucket-1/a/b.tar"),
    ],
)
def test_a_bucket_source_is_normalized(written: str, normalized: str) -> None:
    mount = DataMount(src=written, dst="~/ds")
    assert mount.src == normalized and mount.bucket_url == normalized
    assert mount.node_path(HOME) == HOME / "ds"


def test_a_local_source_has_no_bucket_url_and_keeps_its_text() -> None:
    mount = DataMount(src="./data/s3:/x", dst="~/d")
    assert mount.bucket_url is None and mount.src == "./data/s3:/x"
    with pytest.raises(ValueError, match="is a bucket"):
        DataMount(src="s3://b-1/x", dst="~/d").source_path(Path("/"))


@pytest.mark.parametrize(
    ("src", "said"),
    [
        ("s3://UPPER/x", "invalid S3 bucket name 'UPPER'"),
        ("s3://ab/x", "invalid S3 bucket name 'ab'"),
        ("s3://a..b/x", "invalid S3 bucket name"),
        ("s3:///x", "invalid S3 bucket name ''"),
        ("s3://bkt/a/../b", "no empty, '.' or '..' parts"),
        ("s3://bkt/./b", "no empty, '.' or '..' parts"),
        ("s3://bkt//b", "no empty, '.' or '..' parts"),
        ("s3://bkt/a\tb", "control character"),
        ("s3://bkt/a\x7fb", "control character"),
        ("s3://bkt/" + "k" * 1025, "longer than S3's limit of 1024 bytes"),
        ("gs://bkt/x", "gs:// sources are not supported: give a local path or an s3:// bucket"),
        ("r2://bkt/x", "r2:// sources are not supported"),
        ("https://example.com/x.tar", "https:// sources are not supported"),
    ],
)
def test_a_bad_source_is_refused_with_what_to_write(project: Path, src: str, said: str) -> None:
    spec = MINIMAL + f"data: [{{src: {src!r}, dst: ~/d}}]\n".replace("'", '"')
    message = spec_error(write(project, spec.replace("\t", "\\t").replace("\x7f", "\\x7f")))
    assert "data[0].src" in message and said in message


def test_a_loaded_job_has_none_for_a_bucket_source_and_never_looks_for_it(
    project: Path,
) -> None:
    spec = MINIMAL + (
        "data:\n"
        "  - {src: ./data, dst: ~/data}\n"
        "  - {src: s3://training-sets/imagenet/, dst: ~/imagenet}\n"
    )
    job = load_job(write(project, spec))
    assert job.data_sources == [(project / "data").resolve(), None]
    assert job.spec.data[1].bucket_url == "s3://training-sets/imagenet"
    assert job.spec.data_source_paths(project) == job.data_sources


def test_outputs_are_read_normalized_and_default_to_head() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "n",
            "workdir": ".",
            "run": "r",
            "outputs": [
                {"src": "~/out", "dst": "s3://results-1/run/"},
                {"src": "logs", "dst": "s3://results-1/logs", "nodes": "all"},
            ],
        }  # fmt: skip
    )
    head, every = spec.outputs
    assert head == OutputMount(src="~/out", dst="s3://results-1/run", nodes="head")
    assert head.dst_url == "s3://results-1/run" and head.node_path(HOME) == HOME / "out"
    assert (head.node_url(0), head.node_url(1)) == ("s3://results-1/run", None)
    assert every.node_path(HOME) == HOME / "logs"
    assert every.node_url(2) == "s3://results-1/logs/node-2"
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_outputs_null_is_none_and_default_is_empty() -> None:
    base = {"name": "n", "workdir": ".", "run": "r"}
    assert JobSpec.model_validate(base).outputs == []
    assert JobSpec.model_validate({**base, "outputs": None}).outputs == []


@pytest.mark.parametrize(
    ("outputs", "said"),
    [
        (
            "[{src: ~/out, dst: s3://bkt/a}, {src: out, dst: s3://bkt/b}]",
            "outputs[0] and outputs[1] have the same src out",
        ),
        ("[{src: ~/out, dst: ./local}]", "outputs[0].dst"),
        ("[{src: ~/out, dst: s3://bkt/../x}]", "no empty, '.' or '..' parts"),
        ("[{src: ~other/out, dst: s3://bkt/x}]", "only '~' and '~/...' are supported"),
        ("[{src: ~/out, dst: s3://bkt/x, nodes: some}]", "outputs[0].nodes"),
        ("[{src: ~/out, dst: s3://bkt/x, node: all}]", "unknown field `outputs[0].node`"),
    ],
)
def test_bad_outputs_are_refused_by_place(project: Path, outputs: str, said: str) -> None:
    message = spec_error(write(project, MINIMAL + f"outputs: {outputs}\n"))
    assert said in message


def test_split_bucket_url_gives_the_bucket_and_key() -> None:
    assert split_bucket_url(bucket_url("s3://bkt/a/b/")) == ("bkt", "a/b")
    assert split_bucket_url(bucket_url("s3://bkt")) == ("bkt", "")
