"""The checkpoint store over S3 (a moto server on 127.0.0.1, reached by real loopback nodes).

The nodes' agents upload staged checkpoints with boto3, multipart for large files; the ledger
records each complete version with its keys and digests, the bytes never passing through the
controller; new nodes download the newest checkpoint in parallel and check every digest; and
the controller deletes the versions no rule keeps, and what never became complete.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import boto3
import pytest

from orchestrator.config import LocalSettings, Settings, StoreSettings
from orchestrator.spec.model import CheckpointSpec
from tests.support.checkpoint_nodes import collect_until, end_run, keeper_nodes
from tests.support.waiting import wait_until

BUCKET = "orch-ckpt"


@pytest.fixture
def s3(moto_endpoint: str):  # noqa: ANN201
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def settings_for(home: Path, endpoint: str) -> Settings:
    return Settings(
        home=home,
        local=LocalSettings(network="loopback"),  # so the nodes reach 127.0.0.1 too
        store=StoreSettings(endpoint_url=endpoint, region="us-east-1"),
    )


def keys(s3, prefix: str = "") -> list[str]:  # noqa: ANN001
    reply = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for item in reply.get("Contents", []))


def test_nodes_upload_the_ledger_records_and_new_nodes_restore_from_s3(
    tmp_path: Path, s3, moto_endpoint: str
) -> None:
    job = "s3-1"
    home = tmp_path / "orch"
    settings = settings_for(home, moto_endpoint)
    spec = CheckpointSpec(dir="~/ckpt", store=f"s3://{BUCKET}/team/runs", mirror="none")
    with keeper_nodes(home, job, count=2, checkpoint=spec, settings=settings) as nodes:
        nodes.run(
            0,
            "mkdir -p ckpt/step-000010 && head -c 41943040 /dev/urandom > "
            "ckpt/step-000010/state.pt && : > ckpt/step-000010/COMPLETE",
        )  # 40 MiB
        collect_until(nodes, lambda c: nodes.ledger.checkpoints(job, live_only=True))
        (record,) = nodes.ledger.checkpoints(job, live_only=True)
        assert record.name == "step-000010" and record.stored_at is not None
        assert not record.in_mirror and not nodes.mirror.root.exists()  # mirror: none
        files = json.loads(record.files_json)
        assert {f["path"] for f in files} == {"step-000010/state.pt", "step-000010/COMPLETE"}
        for f in files:
            assert f["key"].startswith(f"team/runs/{job}/step-000010/")
            reply = s3.get_object(Bucket=BUCKET, Key=f["key"])
            body = reply["Body"].read()
            assert hashlib.blake2b(body, digest_size=32).hexdigest() == f["digest"]
            assert len(body) == f["size"]
        weights = next(f for f in files if f["path"] == "step-000010/state.pt")
        etag = s3.head_object(Bucket=BUCKET, Key=weights["key"])["ETag"].strip('"')
        assert etag.endswith("-3"), etag  # 40 MiB went up as a multipart upload of 16 MiB parts
        # A version that never became whole (no COMPLETE yet) is swept at the end.
        nodes.run(0, "mkdir -p ckpt/step-000020 && printf half > ckpt/step-000020/state.pt")
        wait_until(lambda: any("step-000020" in k for k in keys(s3)), "step-000020's upload", 30)
        end_run(nodes.cluster, job)
        nodes.keeper.finish(wait_s=30)
        nodes.keeper.sweep_store()
        assert not any("step-000020" in k for k in keys(s3))
        assert {f["key"] for f in files} <= set(keys(s3))

    with keeper_nodes(home, job, count=2, checkpoint=spec, settings=settings) as nodes:
        assert nodes.resume is not None and nodes.resume.path == "ckpt/step-000010"
        for rank in (0, 1):
            out = nodes.run(rank, "b2sum -l 256 ckpt/step-000010/state.pt")
            assert out.split()[0] == next(
                f["digest"] for f in files if f["path"] == "step-000010/state.pt"
            )
        (restored,) = nodes.events("RESTORED")
        assert "from the store to 2 node(s)" in restored


def test_a_snapshot_saved_again_and_again_keeps_two_versions_in_the_store(
    tmp_path: Path, s3, moto_endpoint: str
) -> None:
    job = "s3-2"
    home = tmp_path / "orch"
    spec = CheckpointSpec(dir="~/ckpt", store=f"s3://{BUCKET}")
    settings = settings_for(home, moto_endpoint)
    with keeper_nodes(home, job, checkpoint=spec, settings=settings) as nodes:
        for n in range(4):
            body = f"version {n}\n" * (n + 1)
            nodes.run(0, f"printf '{body}' > ckpt/snapshot.pt")
            digest = hashlib.blake2b(body.encode(), digest_size=32).hexdigest()
            collect_until(
                nodes,
                lambda c, digest=digest: any(
                    u.name == "snapshot.pt" and u.stored and u.files[0].digest == digest
                    for u in c.complete
                ),
            )
        stored = keys(s3, f"{job}/snapshot.pt@")
        assert len(stored) == 2, stored  # the newest two of four
        live = [r for r in nodes.ledger.checkpoints(job, live_only=True) if r.stored_at]
        assert len(live) == 2
        # mirror: latest (the default with a store) holds the newest
        assert (nodes.mirror.root / "snapshot.pt").read_bytes() == b"version 3\n" * 4
