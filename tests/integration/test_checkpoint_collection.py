"""Checkpoints brought home from real local nodes (sshd, rsync) by their agents and the keeper.

Each test runs the agents exactly as a job does (installed, armed, following a stand-in for the
run) and checks what arrives in the mirror and the ledger: scripts that save in place, files
orch synced, shards spread over several nodes, pulls that fail, and hard-linked copies that
change while they travel.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.collector import CheckpointCollector
from orchestrator.cluster.checkpoints.keeper import KeeperOptions
from orchestrator.spec.model import CheckpointSpec, MirrorMode
from tests.support.checkpoint_nodes import (
    collect_until,
    end_run,
    keeper_nodes,
    wait_for_manifests,
)
from tests.support.waiting import wait_until

IN_PLACE_WRITER = r"""
import hashlib, os, sys, time
path, log, saves = sys.argv[1], sys.argv[2], int(sys.argv[3])
for n in range(1, saves + 1):
    body = os.urandom(1 << 20) * 4  # 4 MiB, like a small torch.save
    with open(path, "r+b" if os.path.exists(path) else "wb") as handle:  # in place
        handle.truncate(0)
        for start in range(0, len(body), 1 << 18):
            handle.write(body[start : start + (1 << 18)])
            handle.flush()
    with open(log, "a") as out:
        out.write(hashlib.blake2b(body, digest_size=32).hexdigest() + "\n")
    time.sleep(1.5)
"""


def sha(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=32).hexdigest()


def test_a_script_saving_in_place_is_mirrored_whole_while_it_runs(tmp_path: Path) -> None:
    """The snapshot reaches the mirror after each save, not at the end of the job; every copy
    there is one whole save."""
    job = "inplace-1"
    options = KeeperOptions(pull_every=3600)  # only the agents' news can trigger a pull
    with keeper_nodes(tmp_path / "orch", job, options=options) as nodes:
        nodes.keeper.watch(nodes.cluster, gone=set, on_failure=lambda reason: None)
        nodes.cluster.head.run("cat > writer.py", stdin=IN_PLACE_WRITER)
        nodes.run(0, "setsid nohup python3 writer.py ckpt/snapshot.pt saves.log 6 "
                     "> writer.out 2>&1 < /dev/null &")  # fmt: skip
        mirrored = nodes.mirror.root / "snapshot.pt"
        seen: list[str] = []

        def three_copies() -> bool:
            if mirrored.exists():
                digest = sha(mirrored)
                if not seen or seen[-1] != digest:
                    seen.append(digest)
            return len(seen) >= 3

        wait_until(
            three_copies, "three whole copies mirrored", 60, interval=0.1,
            fail=lambda said: AssertionError(f"{said}; {seen}, {nodes.events('WARNING')}"),
        )  # fmt: skip
        nodes.keeper.stop_watching()
        saves = nodes.run(0, "cat saves.log").split()
        assert set(seen) <= set(saves), "the mirror held a copy no save wrote"
        records = [r for r in nodes.ledger.checkpoints(job) if r.name == "snapshot.pt"]
        assert len(records) >= 3 and all(r.kind == "file" for r in records)
        live = [r for r in nodes.ledger.checkpoints(job, live_only=True) if r.name == "snapshot.pt"]
        assert len(live) == 1  # older versions left the mirror, and there is no store


SYNCED = (
    "printf code > ckpt/train.py && printf 'name: x' > ckpt/job.yaml && "
    "mkdir -p ckpt/__pycache__ && printf pyc > ckpt/__pycache__/train.cpython-311.pyc"
)


def test_files_orch_synced_are_not_checkpoints_until_the_run_changes_them(tmp_path: Path) -> None:
    """`checkpoint: {dir: .}`: the workdir is the checkpoint directory. What orch synced there
    stays out of the mirror and the ledger; what the run writes or rewrites goes in."""
    job = "synced-1"
    with keeper_nodes(tmp_path / "orch", job, before_arm=SYNCED) as nodes:
        nodes.run(0, "sleep 0.01; printf weights > ckpt/model.pt; printf 'name: y' > ckpt/job.yaml"
                     "; printf pyc2 > ckpt/__pycache__/model.cpython-311.pyc")  # fmt: skip
        end_run(nodes.cluster, job)
        collected = nodes.keeper.finish(wait_s=30)
        assert sorted(u.name for u in collected.installed) == ["job.yaml", "model.pt"]
        held = sorted(p.relative_to(nodes.mirror.root).as_posix()
                      for p in nodes.mirror.root.rglob("*") if p.is_file())  # fmt: skip
        assert held == ["job.yaml", "model.pt"]
        assert sorted(r.name for r in nodes.ledger.checkpoints(job)) == ["job.yaml", "model.pt"]


def test_shards_on_two_nodes_make_one_checkpoint_only_with_both(tmp_path: Path) -> None:
    job = "shards-1"
    with keeper_nodes(tmp_path / "orch", job, count=2) as nodes:
        nodes.run(1, "mkdir -p ckpt/step-000005 && printf one > ckpt/step-000005/__1_0.distcp")
        nodes.run(0, "mkdir -p ckpt/step-000005 && printf zero > ckpt/step-000005/__0_0.distcp"
                     " && sleep 0.05 && printf meta > ckpt/step-000005/.metadata")  # fmt: skip
        end_run(nodes.cluster, job)
        collected = nodes.keeper.finish(wait_s=30)
        (unit,) = collected.installed
        assert unit.kind == "dcp" and {f.rank for f in unit.files} == {0, 1}
        held = sorted(p.name for p in (nodes.mirror.root / "step-000005").iterdir())
        assert held == [".metadata", "__0_0.distcp", "__1_0.distcp"]

    with keeper_nodes(tmp_path / "orch2", job, count=2) as nodes:
        nodes.run(1, "mkdir -p ckpt/step-000009 && printf one > ckpt/step-000009/__1_0.distcp")
        nodes.run(0, "mkdir -p ckpt/step-000009 && printf zero > ckpt/step-000009/__0_0.distcp"
                     " && sleep 0.05 && printf meta > ckpt/step-000009/.metadata")  # fmt: skip
        end_run(nodes.cluster, job)
        # both agents staged; node 1 then stops answering
        wait_for_manifests(nodes, lambda manifest: manifest.done, "both agents done")
        collected = nodes.keeper.finish(skip={1}, wait_s=5)
        assert collected.installed == [] and nodes.mirror.latest_complete() is None


def test_a_failed_pull_keeps_the_mirror_is_recorded_and_tried_again(tmp_path: Path) -> None:
    job = "retry-1"
    options = KeeperOptions(pull_every=3600, backoff_first_s=0.5, backoff_cap_s=1.0,
                            failure_limit_s=3600, failure_min=100)  # fmt: skip
    with keeper_nodes(tmp_path / "orch", job, options=options) as nodes:
        nodes.run(0, "head -c 100 /dev/urandom > ckpt/snapshot.pt")
        first = collect_until(nodes, lambda c: c.installed)
        good = sha(nodes.mirror.root / "snapshot.pt")
        assert [u.name for u in first.installed] == ["snapshot.pt"]
        collector: CheckpointCollector = nodes.keeper.collector
        collector.timeout_s = 0.05  # "the transfer limit": far too short for what follows
        stops: list[object] = []
        nodes.keeper.watch(nodes.cluster, gone=set, on_failure=stops.append)
        nodes.run(0, "head -c 300000000 /dev/zero > ckpt/snapshot.pt")
        started = time.monotonic()
        wait_until(lambda: len(nodes.events("WARNING")) >= 2, "two warnings", 60)
        warning = nodes.events("WARNING")[0]
        assert "checkpoint pull failed (1 in a row" in warning and "did not finish" in warning
        assert sha(nodes.mirror.root / "snapshot.pt") == good  # the last good copy stays
        collector.timeout_s = 3600
        wait_until(
            lambda: (nodes.mirror.root / "snapshot.pt").stat().st_size == 300000000,
            "the whole copy", 120 - (time.monotonic() - started),
        )  # fmt: skip
        nodes.keeper.stop_watching()
        assert stops == [] and nodes.keeper.streak.failures == 0


def test_failures_that_last_stop_the_job_with_the_reason(tmp_path: Path) -> None:
    job = "retry-2"
    options = KeeperOptions(pull_every=3600, backoff_first_s=0.2, backoff_cap_s=0.2,
                            failure_limit_s=1.0, failure_min=3)  # fmt: skip
    with keeper_nodes(tmp_path / "orch", job, options=options) as nodes:
        nodes.keeper.collector.timeout_s = 0.01
        stops: list[object] = []
        done = threading.Event()
        nodes.keeper.watch(
            nodes.cluster, gone=set, on_failure=lambda reason: (stops.append(reason), done.set())
        )
        nodes.run(0, "head -c 200000000 /dev/zero > ckpt/big.pt")
        assert done.wait(60), nodes.events("WARNING")
        (reason,) = stops
        assert "could not be brought home" in reason


def test_a_linked_copy_written_during_its_transfer_is_not_installed(tmp_path: Path) -> None:
    job = "linked-1"
    with keeper_nodes(tmp_path / "orch", job) as nodes:
        nodes.run(0, "mkdir -p ckpt/step-000001 && head -c 1000 /dev/urandom > "
                     "ckpt/step-000001/state.pt && : > ckpt/step-000001/COMPLETE")  # fmt: skip
        wait_for_manifests(  # staged, as hard links
            nodes, lambda manifest: "step-000001/state.pt" in manifest.files, "the copy staged"
        )
        collector = nodes.keeper.collector
        real_fetch = collector._fetch

        def fetch_then_rewrite(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            fetched = real_fetch(*args, **kwargs)
            nodes.run(0, "head -c 1000 /dev/urandom | dd of=ckpt/step-000001/state.pt "
                         "conv=notrunc status=none")  # fmt: skip
            return fetched

        collector._fetch = fetch_then_rewrite  # type: ignore[method-assign]
        collected = nodes.keeper.collect()
        assert collected.installed == [] and nodes.mirror.latest_complete() is None
        collector._fetch = real_fetch  # type: ignore[method-assign]
        collected = collect_until(nodes, lambda c: c.installed)
        on_node = nodes.run(0, "b2sum -l 256 ckpt/step-000001/state.pt").split()[0]
        assert sha(nodes.mirror.root / "step-000001" / "state.pt") == on_node


def test_a_restart_gets_the_mirror_back_and_does_not_fetch_it_again(tmp_path: Path) -> None:
    job = "push-1"
    home = tmp_path / "orch"
    with keeper_nodes(home, job) as nodes:
        nodes.run(0, "mkdir -p ckpt/step-000003 && printf w > ckpt/step-000003/state.pt && "
                     ": > ckpt/step-000003/COMPLETE && printf s > ckpt/snapshot.pt")  # fmt: skip
        end_run(nodes.cluster, job)
        nodes.keeper.finish(wait_s=30)
        recorded = len(nodes.ledger.checkpoints(job))
    with keeper_nodes(home, job, count=2) as nodes:  # new nodes, the same job
        assert nodes.resume is not None
        assert (nodes.resume.path, nodes.resume.step) == ("ckpt/step-000003", 3)
        for rank in (0, 1):
            assert nodes.run(rank, "cat ckpt/step-000003/state.pt ckpt/snapshot.pt") == "ws"
        end_run(nodes.cluster, job)
        collected = nodes.keeper.finish(wait_s=30)
        assert collected.installed == []  # what was put back is known, not fetched again
        assert {u.name for u in collected.complete} >= {"step-000003", "snapshot.pt"}
        assert len(nodes.ledger.checkpoints(job)) == recorded
        assert nodes.events("PUSHED")[-1].startswith("checkpoints to 2 node(s)")


STEP = "mkdir -p ckpt/step-{n} && printf {n} > ckpt/step-{n}/state.pt && : > ckpt/step-{n}/COMPLETE"


@pytest.mark.parametrize(("mirror", "kept"), [
    ("latest", ["step-000002"]),
    ("all", ["step-000001", "step-000002"]),
])  # fmt: skip
def test_the_mirror_mode_decides_which_step_directories_stay_home(
    tmp_path: Path, mirror: MirrorMode, kept: list[str]
) -> None:
    """`latest` lets an older step directory go once a newer one is whole in the mirror; `all`
    keeps every step the nodes still hold."""
    job = f"mirror-{mirror}"
    spec = CheckpointSpec(dir="~/ckpt", mirror=mirror)
    with keeper_nodes(tmp_path / "orch", job, checkpoint=spec) as nodes:
        nodes.run(0, STEP.format(n="000001"))
        collect_until(nodes, lambda c: [u.name for u in c.installed] == ["step-000001"])
        nodes.run(0, STEP.format(n="000002"))
        collect_until(nodes, lambda c: [u.name for u in c.installed] == ["step-000002"])
        held = sorted(p.name for p in nodes.mirror.root.iterdir() if p.name.startswith("step-"))
        assert held == kept
        assert (nodes.mirror.root / "step-000002" / "state.pt").read_text() == "000002"
