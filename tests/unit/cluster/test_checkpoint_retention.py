"""What the store keeps of a job's checkpoints, and when failed pulls end a job (pure)."""

from __future__ import annotations

from orchestrator.cluster.checkpoints.retention import StoredVersion, keys_to_delete, retire
from orchestrator.cluster.checkpoints.streak import PullStreak, pull_failure_reason


def v(record_id: int, name: str, kind: str = "file", step: int | None = None, *keys: str):
    return StoredVersion(record_id, name, kind, step, frozenset(keys or {f"k{record_id}"}))


def test_a_snapshot_saved_in_place_keeps_its_last_two_versions() -> None:
    versions = [v(i, "snapshot.pt") for i in range(1, 6)]
    assert retire(versions, present=None) == {1, 2, 3}


def test_directories_the_nodes_dropped_go_but_never_the_newest() -> None:
    versions = [v(1, "step-000010", "step", 10), v(2, "step-000020", "step", 20),
                v(3, "step-000030", "step", 30)]  # fmt: skip
    assert retire(versions, present={"step-000030"}) == {1, 2}
    assert retire(versions, present=None) == set()  # a node did not answer: keep all
    assert retire(versions, present=set()) == {1, 2}  # gone everywhere: still the newest stays


def test_a_shard_shared_by_a_kept_version_is_not_deleted() -> None:
    old = v(1, "ckpt", "dcp", None, "shared", "old-only")
    mid = v(2, "ckpt", "dcp", None, "shared", "mid")
    new = v(3, "ckpt", "dcp", None, "shared", "new")
    retired = retire([old, mid, new], present={"ckpt"})
    assert retired == {1}
    assert keys_to_delete([old, mid, new], retired) == {"old-only"}


def test_failed_pulls_end_the_job_only_after_a_sustained_streak() -> None:
    streak = PullStreak()
    for at in (0.0, 5.0, 15.0, 35.0, 75.0):
        streak.failed(at, "rsync exited 23")
        assert pull_failure_reason(streak, now=at, limit_s=600, min_failures=5) is None
    assert streak.retry_in(5.0, 120.0) == 80.0
    streak.failed(700.0, "disk full")
    reason = pull_failure_reason(streak, now=700.0, limit_s=600, min_failures=5)
    assert reason is not None
    assert "for 700 s (6 tries in a row)" in reason and "disk full" in reason
    streak.succeeded()
    assert pull_failure_reason(streak, now=2000.0, limit_s=600, min_failures=5) is None
