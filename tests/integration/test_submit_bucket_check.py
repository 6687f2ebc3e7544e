"""`orch submit` and `--dry-run` ask S3 (a moto server over HTTP) about every bucket the spec
names before anything is launched: a dry run shows what each source and output holds, a
missing bucket or prefix refuses the submit (exit 2) naming the field, and access denied is an
error where the nodes use this machine's credentials (local) and a warning where they have their
own (aws). Through the console entry point, in this process."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from orchestrator.cluster.bucket_check import check_buckets
from orchestrator.config import Settings, StoreSettings
from orchestrator.spec.model import JobSpec
from tests.support.doc_blocks import REPO, blocks
from tests.support.helpers import assert_nothing_provisioned
from tests.support.in_process import isolated_home, run_main

BUCKET = "training-sets"
RESULTS = "results-1"


@pytest.fixture
def s3(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Buckets with a prefix of three objects and one lone object; this machine's orch pointed
    at them (ORCH_STORE_ENDPOINT_URL)."""
    isolated_home(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("ORCH_STORE_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("ORCH_STORE_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    client.create_bucket(Bucket=RESULTS)
    for i, size in enumerate((1000, 2000, 3000)):
        client.put_object(Bucket=BUCKET, Key=f"imagenet/train/{i}.bin", Body=b"x" * size)
    client.put_object(Bucket=BUCKET, Key="vocab.txt", Body=b"v" * 42)
    return client


@pytest.fixture
def auth_enforced(moto_endpoint: str) -> Iterator[None]:
    """moto checks every request's credentials from now on (the tests' fake key is no IAM
    user's, so every S3 call is denied), until the test ends."""

    def post(count: str) -> None:
        request = urllib.request.Request(
            f"{moto_endpoint}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # not a form: moto reads the raw body
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200

    post("0")
    try:
        yield
    finally:
        post("inf")


def job(tmp_path: Path, data: str, outputs: str = "[]", provider: str = "local") -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "a.txt").write_text("hello")
    (tmp_path / "data" / "b.txt").write_text("world!")
    (tmp_path / "train.py").write_text("print(1)\n")
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: buckets\nworkdir: .\nrun: python train.py\nprovider: {provider}\n"
        f"data: {data}\noutputs: {outputs}\n"
    )
    return path


def prefix_job(**extra: object) -> JobSpec:
    """A job whose one data source is the prefix of three objects."""
    source = {"src": f"s3://{BUCKET}/imagenet/train", "dst": "~/in"}
    return JobSpec.model_validate(
        {"name": "n", "workdir": ".", "run": "r", "data": [source], **extra}
    )


def test_a_dry_run_shows_each_source_and_output(tmp_path: Path, s3) -> None:  # noqa: ANN001
    spec = job(
        tmp_path,
        f"[{{src: ./data, dst: ~/d}}, {{src: s3://{BUCKET}/imagenet/train/, dst: ~/in}},"
        f" {{src: s3://{BUCKET}/vocab.txt, dst: ~/vocab.txt}}]",
        f"[{{src: ~/out, dst: s3://{RESULTS}/run-1}}]",
    )
    code, out, err = run_main(["submit", str(spec), "--dry-run"])
    assert code == 0, out + err
    lines = [line.strip() for line in out.splitlines()]
    assert "data[0] ./data -> ~/d: 2 file(s), 11 B" in lines, out
    assert f"data[1] s3://{BUCKET}/imagenet/train -> ~/in: 3 object(s), 6.0 KB" in lines, out
    assert f"data[2] s3://{BUCKET}/vocab.txt -> ~/vocab.txt: one object, 42 B" in lines, out
    assert f"outputs[0] ~/out -> s3://{RESULTS}/run-1 (node 0): the bucket exists" in lines
    assert "warning" not in err, err

    code, out, err = run_main(["submit", str(spec), "--dry-run", "--json"])
    assert code == 0, out + err
    data = json.loads(out)["data"]
    assert [(s["files"], s["bytes"]) for s in data["local"]] == [(2, 11)]
    assert [(b["place"], b["found"], b["objects"], b["bytes"]) for b in data["buckets"]] == [
        ("data[1].src", "prefix", 3, 6000),
        ("data[2].src", "object", 1, 42),
        ("outputs[0].dst", "bucket", None, None),
    ]


def test_a_prefix_count_is_bounded_and_says_at_least(tmp_path: Path, s3) -> None:  # noqa: ANN001
    settings = Settings(home=tmp_path, store=StoreSettings(endpoint_url=s3.meta.endpoint_url))
    spec = prefix_job()
    (finding,) = check_buckets(spec, settings, count=True, max_count=2)
    assert (finding.objects, finding.bytes, finding.at_least) == (2, 3000, True)
    (unbounded,) = check_buckets(spec, settings, count=True)
    assert (unbounded.objects, unbounded.at_least) == (3, False)


@pytest.mark.parametrize(
    ("data", "outputs", "said"),
    [
        (
            "[{src: s3://no-such-bucket/x, dst: ~/x}]", "[]",
            "data[0].src s3://no-such-bucket/x: bucket no-such-bucket does not exist",
        ),
        (
            f"[{{src: s3://{BUCKET}/imagenet/val, dst: ~/x}}]", "[]",
            f"data[0].src s3://{BUCKET}/imagenet/val: no object imagenet/val and nothing under "
            f"s3://{BUCKET}/imagenet/val/",
        ),
        (
            f"[{{src: s3://{BUCKET}/imagenet/tr, dst: ~/x}}]", "[]",
            "nothing under",  # a prefix of a key is not a folder
        ),
        (
            "[]", "[{src: ~/out, dst: s3://no-results/run}]",
            "outputs[0].dst s3://no-results/run: bucket no-results does not exist",
        ),
    ],
)  # fmt: skip
def test_a_missing_bucket_or_prefix_refuses_the_submit_before_any_launch(
    tmp_path: Path,
    s3,  # noqa: ANN001
    data: str,
    outputs: str,
    said: str,
) -> None:
    spec = job(tmp_path, data, outputs)
    for extra in (["--dry-run"], ["--yes"]):
        code, out, err = run_main(["submit", str(spec), *extra])
        assert code == 2, out + err
        assert said in " ".join(err.split()), err
        assert "nothing was launched" in err, err
    assert_nothing_provisioned(tmp_path / "orch")


def test_access_denied_refuses_on_local_and_warns_on_aws(
    tmp_path: Path,
    s3,  # noqa: ANN001
    auth_enforced: None,
) -> None:
    source = f"[{{src: s3://{BUCKET}/imagenet/train, dst: ~/in}}]"
    local = job(tmp_path, source)
    code, out, err = run_main(["submit", str(local), "--yes"])
    assert code == 2, out + err
    flat = " ".join(err.split())
    assert f"data[0].src s3://{BUCKET}/imagenet/train: access denied" in flat, err
    assert "which the nodes use too: grant them s3:GetObject and s3:ListBucket on it" in flat, err
    assert_nothing_provisioned(tmp_path / "orch")

    settings = Settings(home=tmp_path, store=StoreSettings(endpoint_url=s3.meta.endpoint_url))
    spec = prefix_job(provider="aws", outputs=[{"src": "~/out", "dst": f"s3://{RESULTS}/x"}])
    findings = check_buckets(spec, settings)
    assert [(f.outcome, f.severity(True), f.severity(False)) for f in findings] == [
        ("denied", "warning", "error"),
        ("denied", "warning", "error"),
    ]
    assert "the nodes will try with their own instance role" in findings[0].message(True)


def test_no_credentials_or_no_endpoint_here_is_said_plainly(
    tmp_path: Path,
    s3,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = prefix_job()
    settings = Settings(home=tmp_path, store=StoreSettings(endpoint_url=s3.meta.endpoint_url))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (none,) = check_buckets(spec, settings)
    assert (none.outcome, none.severity(False), none.severity(True)) == (
        "no-credentials", "error", "warning",
    )  # fmt: skip
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE" in none.message(False)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    gone = Settings(home=tmp_path, store=StoreSettings(endpoint_url="http://127.0.0.1:9"))
    (unreachable,) = check_buckets(spec, gone)
    assert unreachable.outcome == "unreachable"
    assert unreachable.severity(False) == "warning"
    assert "cannot tell whether it is there" in unreachable.message(False)


def test_the_docs_example_is_checked_and_shown(tmp_path: Path, s3) -> None:  # noqa: ANN001
    (example,) = [
        b
        for b in blocks(REPO / "docs" / "spec.md")
        if "test_the_docs_example_is_checked_and_shown" in b.arg
    ]
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.json").write_text("{}")
    (tmp_path / "train.py").write_text("print(1)\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: docs\nworkdir: .\nrun: python train.py\n" + example.text)
    code, out, err = run_main(["submit", str(spec), "--dry-run"])
    assert code == 0, out + err
    lines = [line.strip() for line in out.splitlines()]
    assert "data[0] ./tokenizer -> ~/tokenizer: 1 file(s), 2 B" in lines, out
    assert f"data[1] s3://{BUCKET}/imagenet -> ~/imagenet: 3 object(s), 6.0 KB" in lines, out
    assert f"data[2] s3://{BUCKET}/vocab.txt -> ~/vocab.txt: one object, 42 B" in lines, out
    assert (
        f"outputs[1] ~/logs -> s3://{RESULTS}/logs (every node, under node-<rank>/): "
        "the bucket exists"
    ) in lines, out


def test_a_skypilot_mount_is_checked_and_its_copy_is_said(tmp_path: Path, s3) -> None:  # noqa: ANN001
    (tmp_path / "main.py").write_text("print(1)\n")
    task = tmp_path / "task.yaml"
    task.write_text(
        "num_nodes: 2\nrun: python main.py\nfile_mounts:\n"
        f"  /data: {{source: s3://{BUCKET}/imagenet/train, mode: MOUNT_CACHED}}\n"
    )
    code, out, err = run_main(["submit", str(task), "--dry-run"])
    assert code == 0, out + err
    assert (
        f"warning: file_mounts./data: orch copies s3://{BUCKET}/imagenet/train to every node"
    ) in " ".join(err.split()), err
    assert f"data[0] s3://{BUCKET}/imagenet/train -> /data: 3 object(s), 6.0 KB" in out, out

    code, out, err = run_main(["submit", str(task), "--dry-run", "--json"])
    assert code == 0, out + err
    (notice,) = json.loads(out)["notices"]
    assert "instead of mounting it (MOUNT_CACHED)" in notice
