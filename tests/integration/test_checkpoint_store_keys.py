"""Store keys are the controller's, never a node's: a manifest rewritten by job code on a real
local node names keys outside the job's prefix (`../x`, absolute paths, another job's and
another team's objects), and the controller records none of them and deletes nothing but the
job's own objects, on a `file://` store and on S3 (a moto server over HTTP).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import boto3
import pytest

from orchestrator.cluster.checkpoints.store import StoreError, open_client
from orchestrator.config import LocalSettings, Settings, StoreSettings
from orchestrator.node.checkpoint_files import store_key
from orchestrator.spec.model import CheckpointSpec
from tests.support.checkpoint_nodes import KeeperNodes, keeper_nodes
from tests.support.forged_manifests import freeze_agent, manifest, staged_entry, write_manifest

BUCKET = "orch-ckpt"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def step(name: str, keys: dict[str, object]) -> dict:
    """A complete `step-N/` checkpoint in a manifest: each file staged with the given key."""
    return {f"{name}/{file}": staged_entry(sha(name + file), stored=key)
            for file, key in keys.items()}  # fmt: skip


def retire_a_forged_step(nodes: KeeperNodes, prefix: str, evil: list[str]) -> None:
    """Record `step-000001` with the `evil` keys next to an honest `step-000002`, then let the
    nodes drop `step-000001`: the store's retention retires it and deletes its keys."""
    honest = {f: store_key(prefix, nodes.job_id, f"step-000002/{f}", sha("step-000002" + f))
              for f in ("w.pt", "COMPLETE")}  # fmt: skip
    forged = {f"x{i}.pt": key for i, key in enumerate(evil)} | {"COMPLETE": evil[0]}
    freeze_agent(nodes)
    write_manifest(nodes, manifest(step("step-000001", forged) | step("step-000002", honest), 10))
    nodes.keeper.collect()
    write_manifest(nodes, manifest(step("step-000002", honest), 11))
    nodes.keeper.collect()
    nodes.keeper.sweep_store()


def ignored_key_events(nodes: KeeperNodes) -> list[str]:
    return [m for m in nodes.events("WARNING") if "store key" in m and "ignored" in m]


def test_a_forged_manifest_deletes_nothing_outside_the_job_on_a_file_store(
    tmp_path: Path,
) -> None:
    job = "keys-file"
    root = tmp_path / "store"
    victim = tmp_path / "victim.txt"
    absolute = tmp_path / "absolute.txt"
    other = root / "other-job" / "w.pt@0123456789abcdef"
    for path in (victim, absolute, other):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("keep me")
    spec = CheckpointSpec(dir="~/ckpt", store=f"file://{root}", mirror="none")
    with keeper_nodes(tmp_path / "orch", job, checkpoint=spec) as nodes:
        evil = ["../victim.txt", str(absolute), "other-job/w.pt@0123456789abcdef"]
        retire_a_forged_step(nodes, "", evil)

        assert victim.exists() and absolute.exists() and other.exists()
        (record,) = nodes.ledger.checkpoints(job, live_only=True)
        assert record.name == "step-000002"
        events = ignored_key_events(nodes)
        assert len(events) == 4, events  # once per forged file, not once per collection
        assert any("../victim.txt" in e for e in events)


def test_a_store_folder_swapped_for_a_link_is_not_followed_by_the_sweep(tmp_path: Path) -> None:
    """Job code that can write the store (a shared mount) turns the job's folder into a link
    to a folder of this machine: the end-of-job sweep deletes nothing there."""
    job = "keys-link"
    root = tmp_path / "store"
    outside = tmp_path / "home-of-the-user"
    outside.mkdir()
    (outside / "thesis.tex").write_text("keep me")
    spec = CheckpointSpec(dir="~/ckpt", store=f"file://{root}", mirror="none")
    with keeper_nodes(tmp_path / "orch", job, checkpoint=spec) as nodes:
        nodes.run(0, f"mkdir -p {root} && rm -rf {root}/{job} && ln -s {outside} {root}/{job}")
        nodes.keeper.sweep_store()

        assert (outside / "thesis.tex").read_text() == "keep me"
        assert any("symlink" in m for m in nodes.events("WARNING")), nodes.events("WARNING")


@pytest.fixture
def s3(moto_endpoint: str):  # noqa: ANN201
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def test_a_forged_manifest_deletes_nothing_outside_the_job_on_s3(
    tmp_path: Path, s3, moto_endpoint: str
) -> None:
    job = "keys-s3"
    others = ["other-team/j-1/w.pt@0123456789abcdef", "team/runs/other-job/w.pt@0123456789abcdef",
              f"team/runs/{job}-2/w.pt@0123456789abcdef", "team/runs/x.pt"]  # fmt: skip
    for key in others:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"keep me")
    home = tmp_path / "orch"
    settings = Settings(
        home=home,
        local=LocalSettings(network="loopback"),
        store=StoreSettings(endpoint_url=moto_endpoint, region="us-east-1"),
    )
    spec = CheckpointSpec(dir="~/ckpt", store=f"s3://{BUCKET}/team/runs", mirror="none")
    with keeper_nodes(home, job, checkpoint=spec, settings=settings) as nodes:
        retire_a_forged_step(nodes, "team/runs", others)

        listed = {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
        assert set(others) <= listed
        (record,) = nodes.ledger.checkpoints(job, live_only=True)
        assert record.name == "step-000002"
        assert len(ignored_key_events(nodes)) == 5


def test_the_s3_client_of_a_job_refuses_keys_outside_it_and_deletes_nothing_of_them(
    tmp_path: Path, s3, moto_endpoint: str
) -> None:
    settings = Settings(home=tmp_path, store=StoreSettings(endpoint_url=moto_endpoint))
    client = open_client(f"s3://{BUCKET}/team/runs", settings, "j-1", region="us-east-1")
    assert client is not None
    own = ["team/runs/j-1/w.pt@0123456789abcdef", "team/runs/j-1/s/x.pt@0123456789abcdef"]
    odd = ["team/runs/j-1/../j-2/w.pt@01", "team/runs/j-1/w\x1b.pt@0123456789abcdef"]
    foreign = ["team/runs/j-10/w.pt@0123456789abcdef", "other/j-1/w.pt@0123456789abcdef", *odd]
    for key in own + foreign:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    assert sorted(client.keys()) == sorted(own + odd)  # listing: its prefix only
    for key in foreign:
        with pytest.raises(StoreError, match="refusing to delete"):
            client.delete([own[0], key])
    client.delete(own)
    left = {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert left == set(foreign)
