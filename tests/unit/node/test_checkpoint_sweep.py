"""The store sweep at a job's end deletes only what it can prove is garbage.

A job rebuilt on a new controller host lost its old ledger's records of what it had stored:
objects the new ledger never recorded may be the only copy of a lost node's shards, so the
sweep keeps them and says so; objects of versions this ledger recorded and no longer keeps
are deleted as before. On a real SQLite ledger and a `file://` store.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.records import CheckpointRecords
from orchestrator.config import Settings
from orchestrator.ledger.rebuilt import REBUILT_EVENT
from orchestrator.ledger.store import CheckpointRecord, Job, Ledger, utcnow
from orchestrator.node.checkpoint_protocol import StoreKeys

JOB = "swept-1a2b3c"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stored(root: Path, path: str) -> str:
    """Put an object for `path` in the store, named as the agent names it; its key."""
    key = StoreKeys("", JOB).key(path, digest(path))
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_text(path)
    return key


def record(ledger: Ledger, name: str, *, live: bool) -> None:
    """A recorded version of `name/w.pt` (stored and kept, or superseded and pruned)."""
    path = f"{name}/w.pt"
    files = [{"path": path, "digest": digest(path), "size": 1, "key": "k"}]
    now = utcnow()
    ledger.add_checkpoint(
        CheckpointRecord(
            job_id=JOB, name=name, step=int(name.split("-")[1]), size_bytes=1, pulled_at=now,
            kind="step", digest=digest(name), in_mirror=False, stored_at=now if live else None,
            store_url="file://", files_json=json.dumps(files), pruned_at=None if live else now,
        )
    )  # fmt: skip


def objects(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("rebuilt", [True, False])
def test_the_sweep_keeps_what_the_ledger_cannot_vouch_for_after_a_rebuild(
    tmp_path: Path, ledger: Ledger, rebuilt: bool
) -> None:
    root = tmp_path / "store"
    ledger.add_job(
        Job(id=JOB, name="swept", provider="local", nodes=2, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=utcnow())
    )  # fmt: skip
    if rebuilt:
        ledger.add_event(JOB, REBUILT_EVENT, "rebuilt on a new controller host")
    record(ledger, "step-000020", live=True)
    record(ledger, "step-000015", live=False)
    kept = stored(root, "step-000020/w.pt")
    superseded = stored(root, "step-000015/w.pt")
    before = {stored(root, "step-000010/w.pt"), stored(root, "step-000012/shard-1.pt")}
    records = CheckpointRecords(
        job_id=JOB, store=f"file://{root}", mirror=CheckpointMirror(tmp_path / "mirror"),
        ledger=ledger, settings=Settings(home=tmp_path / "orch"), line=lambda _: None,
    )  # fmt: skip

    records.sweep_store()

    left = objects(root)
    assert kept in left and superseded not in left
    said = [e.message for e in ledger.events(JOB) if e.kind == "STORE"]
    if rebuilt:
        assert before <= left, "an object the new ledger never knew was deleted"
        assert any("kept 2 object(s)" in m and "rebuilt" in m for m in said), said
    else:
        assert not before & left  # a ledger that saw the whole job proves them garbage
        assert any("removed 3 object(s)" in m for m in said), said
