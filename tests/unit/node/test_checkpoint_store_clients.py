"""The controller's side of a `file://` checkpoint store, on real folders: a client deletes only
its job's canonical keys and follows no symlink below the store's folder, and the ledger's
records restore from and delete only keys the controller computes, also for a record written
with a key a node named."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.collector import Collected
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.records import CheckpointRecords
from orchestrator.cluster.checkpoints.store import FileStoreClient, StoreError
from orchestrator.config import Settings
from orchestrator.ledger.store import CheckpointRecord, Job, Ledger, make_engine
from orchestrator.node.checkpoint_protocol import (
    AgentReport,
    NodeFile,
    NodeManifest,
    StagedCopy,
    StoreKeys,
)

JOB = "j-1"
KEYS = StoreKeys("", JOB)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / JOB / "step-000001").mkdir(parents=True)
    return root


def put(path: Path, text: str = "keep me") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_file_client_deletes_its_job_s_keys_and_refuses_any_other(
    store: Path, tmp_path: Path
) -> None:
    client = FileStoreClient(store, KEYS)
    own = put(store / JOB / "step-000001" / "w.pt@0123456789abcdef")
    victim = put(tmp_path / "victim.txt")
    other = put(store / "j-10" / "w.pt@0123456789abcdef")
    for foreign in ["../victim.txt", str(victim), f"{JOB}/../j-10/w.pt@0123456789abcdef",
                    "j-10/w.pt@0123456789abcdef", f"{JOB}/w\x00.pt", f"{JOB}//w.pt"]:  # fmt: skip
        with pytest.raises(StoreError, match="refusing to delete"):
            client.delete([own.relative_to(store).as_posix(), foreign])
        assert own.exists()  # nothing of a batch with a foreign key is deleted
    assert victim.exists() and other.exists()
    client.delete([f"{JOB}/step-000001/w.pt@0123456789abcdef", f"{JOB}/gone.pt@0123456789abcdef"])
    assert not own.exists()


def test_a_file_client_follows_no_symlink_below_the_store(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    victim = put(outside / "w.pt@0123456789abcdef")
    (store / JOB / "step-000002").symlink_to(outside)
    client = FileStoreClient(store, KEYS)
    with pytest.raises(StoreError, match="symlink"):
        client.delete([f"{JOB}/step-000002/w.pt@0123456789abcdef"])
    assert victim.exists()
    put(store / JOB / "step-000001" / "x.pt@0123456789abcdef")
    assert client.keys() == [f"{JOB}/step-000001/x.pt@0123456789abcdef"]  # the link: not walked

    shutil.rmtree(store / JOB)
    (store / JOB).symlink_to(outside)  # the job's own folder, swapped for a link
    with pytest.raises(StoreError, match="symlink"):
        client.keys()
    with pytest.raises(StoreError, match="symlink"):
        client.delete([f"{JOB}/w.pt@0123456789abcdef"])
    assert victim.exists()


def test_records_restore_from_and_delete_only_computed_keys(store: Path, tmp_path: Path) -> None:
    """Records written before keys were computed hold whatever key the node named."""
    now = datetime.now(UTC)
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    ledger.add_job(Job(id=JOB, name="j", provider="local", nodes=1, gpus_per_node=1,
                       spec_json="{}", spec_path="job.yaml", created_at=now))  # fmt: skip
    victim = put(tmp_path / "victim.txt")
    url = f"file://{store}"
    for step in (1, 2):
        name = f"step-00000{step}"
        files = [{"path": f"{name}/w.pt", "digest": sha(name), "size": 1, "key": "../victim.txt"}]
        ledger.add_checkpoint(
            CheckpointRecord(
                job_id=JOB, name=name, step=step, size_bytes=1, pulled_at=now, kind="step",
                digest=sha(name + "v"), in_mirror=False, stored_at=now, store_url=url,
                files_json=json.dumps(files),
            )
        )  # fmt: skip
    own = put(store / JOB / "step-000001" / f"w.pt@{sha('step-000001')[:16]}")
    records = CheckpointRecords(
        job_id=JOB, store=url, mirror=CheckpointMirror(tmp_path / "mirror" / "checkpoints"),
        ledger=ledger, settings=Settings(home=tmp_path / "orch"), line=lambda _text: None,
    )  # fmt: skip

    plan = records.store_plan()
    assert plan is not None and plan.name == "step-000002"
    assert [i.key for i in plan.items] == [f"{JOB}/step-000002/w.pt@{sha('step-000002')[:16]}"]

    # Every node answers and holds step-000002 only: step-000001 is retired from the store.
    staged = StagedCopy(sha("step-000002"), 1, 5, 6, sha("o"), False, None)
    manifest = NodeManifest(0, 1, False, False, {"step-000002/w.pt": NodeFile(
        "step-000002/w.pt", 1, 5, staged)}, {}, ())  # fmt: skip
    records.record(Collected(reports={0: AgentReport("alive", manifest)}), ranks=[0])
    assert not own.exists()
    assert victim.read_text() == "keep me"
    live = [r.name for r in ledger.checkpoints(JOB, live_only=True) if r.stored_at]
    assert live == ["step-000002"]
