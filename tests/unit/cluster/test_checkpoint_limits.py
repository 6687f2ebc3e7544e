"""What one collection may bring home: the size cap and the free disk, decided before a pull;
and what is refused is an event once, with a bound per job."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cluster.checkpoints.keeper import MAX_NOTICE_EVENTS, CheckpointKeeper
from orchestrator.cluster.checkpoints.limits import Disk, headroom, plan_pull
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.units import Unit, UnitFile
from orchestrator.config import Settings
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.node.checkpoint_protocol import Notice
from orchestrator.spec.model import CheckpointSpec

GIB = 1024**3
BIG_DISK = Disk("/home/me/.orch/jobs/j", free=500 * GIB, total=1000 * GIB)


def unit(name: str, size: int, kind: str = "step", written: int = 0) -> Unit:
    files = (UnitFile(f"{name}/w.pt" if kind != "file" else name, 0, "ab" * 32, size, "cd" * 32,
                      None),)  # fmt: skip
    return Unit(name, kind, files, written)


def sizes(u: Unit) -> int:
    return u.size_bytes


def test_a_checkpoint_over_the_cap_is_refused_and_says_which_setting_to_change() -> None:
    units = [unit("step-000001", 5), unit("step-000002", 50), unit("snapshot.pt", 3, "file")]
    plan = plan_pull(units, sizes, cap=10, disk=BIG_DISK)
    assert [u.name for u in plan.take] == ["step-000001", "snapshot.pt"]
    (notice,) = plan.notices
    assert notice.about == "cap:step-000002"
    assert "checkpoint.max_pull_bytes" in notice.message
    assert "ORCH_CHECKPOINT_MAX_PULL_BYTES" in notice.message
    assert "checkpoint.mirror: none" in notice.message


def test_one_collection_brings_at_most_the_cap_newest_directory_first() -> None:
    units = [unit("step-000001", 6), unit("step-000002", 6), unit("snapshot.pt", 4, "file")]
    plan = plan_pull(units, sizes, cap=10, disk=BIG_DISK)
    assert [u.name for u in plan.take] == ["step-000002", "snapshot.pt"]
    assert plan.notices == []  # step-000001 waits for the next collection


def test_no_cap_takes_everything_that_fits_on_the_disk() -> None:
    units = [unit(f"step-00000{i}", 10 * GIB) for i in range(1, 4)]
    assert len(plan_pull(units, sizes, cap=0, disk=BIG_DISK).take) == 3


def test_a_pull_that_would_leave_too_little_free_is_refused_with_where_and_how_much() -> None:
    disk = Disk("/home/me/.orch/jobs/j", free=3 * GIB, total=1000 * GIB)
    units = [unit("step-000001", GIB), unit("step-000002", int(2.5 * GIB))]
    plan = plan_pull(units, sizes, cap=0, disk=disk)
    assert [u.name for u in plan.take] == ["step-000001"]  # 3 GiB free, 1 GiB kept free
    (notice,) = plan.notices
    assert notice.about == "disk:step-000002"
    assert "/home/me/.orch/jobs/j" in notice.message and "free" in notice.message


def test_the_headroom_is_a_gib_or_a_twentieth_of_a_small_disk() -> None:
    assert headroom(1000 * GIB) == GIB
    assert headroom(16 * 1024 * 1024) == 16 * 1024 * 1024 // 20


def test_what_the_mirror_holds_already_costs_nothing() -> None:
    units = [unit("step-000001", 50)]
    assert plan_pull(units, lambda _u: 0, cap=10, disk=BIG_DISK).take == units


def test_refusals_are_events_once_each_and_bounded_per_job(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    ledger.add_job(
        Job(id="j", name="j", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=datetime.now(UTC))
    )  # fmt: skip
    keeper = CheckpointKeeper(
        job_id="j", checkpoint=CheckpointSpec(dir="~/ckpt"), node_dir="ckpt",
        mirror=CheckpointMirror(tmp_path / "m" / "checkpoints"), ledger=ledger,
        settings=Settings(home=tmp_path), line=lambda _text: None,
    )  # fmt: skip
    same = [Notice("cap:a", "a is over the cap")] * 3
    keeper._note(same)
    keeper._note(same)
    keeper._note([Notice(f"path:{i}", f"refused {i}") for i in range(3 * MAX_NOTICE_EVENTS)])
    warnings = [e.message for e in ledger.events("j") if e.kind == "WARNING"]
    assert len(warnings) == MAX_NOTICE_EVENTS + 1
    assert warnings.count("a is over the cap") == 1
    assert "further ones are not recorded" in warnings[-1]
