"""Pulls from a node (rsync over ssh from a real local node, both ends as root here) bring
plain files only, whatever the node's checkpoint folder holds.

The node's folder holds what job code could leave there: a setuid and setgid program, a
sticky folder, a FIFO, a character device, a symlink to /etc/passwd and files of another
owner. What arrives in ORCH_HOME is regular files and folders of the user who runs orch,
0600 and 0700: no special file, no link, no foreign owner, no set-id or sticky bit.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.remote.sync import pull_argv, pull_file_argv, run_rsync
from tests.support.helpers import loopback_cluster

pytestmark = pytest.mark.timeout(120)

JOB = "pull-modes"
FOREIGN = 12345  # a uid and gid nobody on this machine has

SETUP = f"""
set -e
mkdir -p ckpt/sticky
printf 'program' > ckpt/setid && chmod 6755 ckpt/setid
chmod 1777 ckpt/sticky && printf shard > ckpt/sticky/shard.pt
printf weights > ckpt/state.pt && chown {FOREIGN}:{FOREIGN} ckpt/state.pt ckpt/sticky
mkfifo ckpt/fifo
mknod ckpt/device c 1 3
ln -s /etc/passwd ckpt/passwd
"""
NAMES = ["setid", "sticky/shard.pt", "state.pt", "fifo", "device", "passwd"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path_factory.mktemp("orch"), JOB, count=1) as built:
        built.head.run(SETUP)
        kinds = built.head.run("cd ckpt && stat -c '%n %F %a %u' setid sticky fifo device passwd")
        assert kinds.stdout.splitlines() == [
            "setid regular file 6755 0",
            "sticky directory 1777 12345",
            "fifo fifo 644 0",
            "device character special file 644 0",
            "passwd symbolic link 777 0",
        ]
        yield built


def arrived(root: Path) -> dict[str, tuple[str, int, int]]:
    """What is under `root`: path -> (kind, mode bits, owner uid)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file" if path.is_file() else "other"
        if path.is_symlink():
            kind = "link"
        found[str(path.relative_to(root))] = (kind, stat.S_IMODE(info.st_mode), info.st_uid)
    return found


ME = os.geteuid()
PLAIN = {
    "setid": ("file", 0o600, ME),
    "state.pt": ("file", 0o600, ME),
    "sticky": ("dir", 0o700, ME),
    "sticky/shard.pt": ("file", 0o600, ME),
}


def test_a_pull_of_a_folder_brings_plain_files_only(tmp_path: Path, cluster: Cluster) -> None:
    into = tmp_path / "mirror"
    argv = pull_argv(cluster.addresses[0], cluster.identity, "ckpt", into)
    run_rsync(argv, what="pull", timeout=60)
    assert arrived(into) == PLAIN
    assert (into / "setid").read_text() == "program"


def test_a_pull_of_listed_files_brings_plain_files_only(tmp_path: Path, cluster: Cluster) -> None:
    into = tmp_path / "mirror"
    listing = tmp_path / "list"
    listing.write_text("".join(f"{name}\0" for name in NAMES))
    argv = pull_argv(cluster.addresses[0], cluster.identity, "ckpt", into, files_from=listing)
    run_rsync(argv, what="pull", timeout=60)
    assert arrived(into) == PLAIN
    assert (into / "state.pt").read_text() == "weights"


@pytest.mark.parametrize("name", ["setid", "fifo", "device", "passwd"])
def test_a_pull_of_one_file_brings_a_plain_file_or_nothing(
    tmp_path: Path, cluster: Cluster, name: str
) -> None:
    local = tmp_path / "fetched" / name
    argv = pull_file_argv(cluster.addresses[0], cluster.identity, f"ckpt/{name}", local)
    run_rsync(argv, what="fetch", timeout=60)
    if name == "setid":
        assert arrived(local.parent) == {"setid": ("file", 0o600, ME)}
    else:
        assert not local.exists() and not local.is_symlink()
