"""What a node says about its checkpoints is data with bounds, on real local nodes and real rsync.

A path with a NUL or another control character is refused with an event and the collection goes
on; a checkpoint bigger than `checkpoint.max_pull_bytes` is not pulled, and says which setting to
change; a node that sends more than its manifest reported gets nothing installed; and a pull
that would fill the disk of the mirror is refused before it starts. In every case the mirror
keeps what it had and holds no part of what was refused.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config import CheckpointSettings, LocalSettings, Settings
from tests.support.checkpoint_nodes import KeeperNodes, collect_until, keeper_nodes
from tests.support.forged_manifests import freeze_agent, read_manifest, thaw_agent, write_manifest

MIB = 1024 * 1024


def installed(nodes: KeeperNodes) -> set[str]:
    return set(nodes.mirror.units())


def complete(name: str):  # noqa: ANN201
    return lambda collected: any(u.name == name for u in collected.complete)


def warnings(nodes: KeeperNodes, *words: str) -> list[str]:
    return [m for m in nodes.events("WARNING") if all(w in m for w in words)]


def capped(home: Path, cap: int) -> Settings:
    return Settings(
        home=home,
        local=LocalSettings(network="loopback"),
        checkpoint=CheckpointSettings(max_pull_bytes=cap),
    )


def test_nul_and_control_characters_in_manifest_paths_are_refused_and_collection_goes_on(
    tmp_path: Path,
) -> None:
    with keeper_nodes(tmp_path / "orch", "ctl-1") as nodes:
        nodes.run(0, "printf ok > ckpt/ok.pt")
        collect_until(nodes, lambda c: "ok.pt" in installed(nodes))
        freeze_agent(nodes)
        document = read_manifest(nodes)
        entry = document["files"]["ok.pt"]
        for bad in ("bad\x00name.pt", "esc\x1b[31m.pt", "new\nline.pt", "dir\x7f/x.pt"):
            document["files"][bad] = entry
        document["generation"] += 1
        write_manifest(nodes, document)

        nodes.keeper.collect()  # an exception here (a NUL byte in a path) would fail the job
        nodes.keeper.collect()

        assert installed(nodes) == {"ok.pt"}
        refused = warnings(nodes, "control characters")
        assert len(refused) == 4, refused  # one each, not one per collection
        assert any("bad\\x00name.pt" in m for m in refused)
        assert not any("\x00" in m or "\x1b" in m for m in nodes.events("WARNING"))
        thaw_agent(nodes)
        nodes.run(0, "printf next > ckpt/next.pt")
        collect_until(nodes, lambda c: "next.pt" in installed(nodes))


def test_a_file_whose_name_holds_a_control_character_is_not_staged_and_says_so(
    tmp_path: Path,
) -> None:
    with keeper_nodes(tmp_path / "orch", "ctl-2") as nodes:
        nodes.run(0, "printf a > \"ckpt/$(printf 'tab\\tname.pt')\" && printf b > ckpt/fine.pt")
        collect_until(nodes, lambda c: "fine.pt" in installed(nodes))
        collect_until(nodes, lambda c: warnings(nodes, "control characters"))
        assert installed(nodes) == {"fine.pt"}
        assert any("tab\\x09name.pt" in m for m in warnings(nodes, "control characters"))


def test_a_checkpoint_over_the_cap_is_not_pulled_and_the_event_says_what_to_do(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    with keeper_nodes(home, "cap-1", settings=capped(home, MIB)) as nodes:
        nodes.run(0, f"head -c {2 * MIB} /dev/urandom > ckpt/big.pt && printf s > ckpt/small.pt")
        collect_until(nodes, lambda c: complete("big.pt")(c) and "small.pt" in installed(nodes))
        nodes.keeper.collect()

        assert installed(nodes) == {"small.pt"}
        assert not (nodes.mirror.root / "big.pt").exists()
        assert not nodes.mirror.incoming.exists()  # no part of it is left anywhere
        (refused,) = warnings(nodes, "big.pt")
        assert "checkpoint.max_pull_bytes" in refused
        assert "ORCH_CHECKPOINT_MAX_PULL_BYTES" in refused
        assert not any(r.name == "big.pt" for r in nodes.ledger.checkpoints("cap-1"))


def test_a_node_that_sends_more_than_it_reported_gets_nothing_installed(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    with keeper_nodes(home, "cap-2", settings=capped(home, MIB)) as nodes:
        nodes.run(0, f"head -c {3 * MIB} /dev/urandom > ckpt/big.pt")
        collect_until(nodes, complete("big.pt"))
        freeze_agent(nodes)
        document = read_manifest(nodes)
        entry = document["files"]["big.pt"]
        entry["size"] = entry["staged"]["size"] = 1000  # what job code claims
        document["generation"] += 1
        write_manifest(nodes, document)

        nodes.keeper.collect()

        assert "big.pt" not in installed(nodes)
        assert not (nodes.mirror.root / "big.pt").exists()
        assert not nodes.mirror.incoming.exists()
        assert warnings(nodes, "node 0", "more than", "1000"), nodes.events("WARNING")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """ORCH_HOME whose job folders lie on a 16 MiB tmpfs (tests run as root)."""
    home = tmp_path / "orch"
    jobs = home / "jobs"
    jobs.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(jobs)], check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(jobs)], check=True)


def test_a_pull_that_would_fill_the_disk_is_refused_before_it_starts(small_disk: Path) -> None:
    with keeper_nodes(small_disk, "disk-1") as nodes:
        nodes.run(0, f"head -c {9 * MIB} /dev/urandom > ckpt/a.pt")
        collect_until(nodes, lambda c: "a.pt" in installed(nodes))
        nodes.run(0, f"head -c {9 * MIB} /dev/urandom > ckpt/b.pt")

        collect_until(nodes, complete("b.pt"))  # unchecked, rsync fills the disk and raises

        assert installed(nodes) == {"a.pt"}
        assert not nodes.mirror.incoming.exists()
        (refused,) = warnings(nodes, "b.pt", "free")
        assert str(nodes.mirror.root.parent) in refused
