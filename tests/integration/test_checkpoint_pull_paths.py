"""Real checkpoint pulls (rsync over ssh from a local node) stay inside ORCH_HOME/jobs/<id>/.

The node's checkpoint directory holds what a buggy or hostile script could leave there:
symlinks to /etc, to `..` and to a complete checkpoint elsewhere, a `latest` pointer naming
../../x (as a file and as a link), names with quotes, `$`, backticks, unicode, leading dots,
newlines and tabs, and bytes that are not UTF-8. Only regular files of the directory arrive,
byte for byte, names with control characters not at all (an event says so), and nothing
outside the job's own directory changes on this machine. An ORCH_HOME with spaces, quotes and
`%` works too.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

from orchestrator.remote.sync import push_argv, run_rsync
from tests.support.checkpoint_nodes import end_run, keeper_nodes, wait_for_manifests

JOB = "paths-1"
HOSTILE = "we ird $x;`id`\"q' ü"
CONTROL = "new\nline\tname.pt"

SETUP = f"""
set -e
mkdir -p ckpt outside/step
printf node-secret > outside/secret
printf state > outside/step/state.pt
: > outside/step/COMPLETE
ln -s /etc ckpt/etc
ln -s .. ckpt/up
ln -s ../../.. ckpt/far
ln -s "$HOME/outside/step" ckpt/step-000002
ln -s ../../x ckpt/latest-link
printf '../../x' > ckpt/latest
mkdir ckpt/step-000001
printf weights > ckpt/step-000001/state.pt
: > ckpt/step-000001/COMPLETE
printf hostile > ckpt/{shlex.quote(HOSTILE)}
printf control > ckpt/{shlex.quote(CONTROL)}
printf dots > ckpt/..dots
printf bytes > "ckpt/$(printf 'bad\\377name')"
"""


def _tree(root: Path, skip: list[Path]) -> dict[str, str]:
    """Every path under `root` (not following links) with a digest of what it is."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in dirnames + filenames:
            path = here / name
            if path in skip:
                continue
            if path.is_symlink():
                found[str(path)] = "link:" + os.readlink(path)
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path)] = "dir"
    return found


def test_pulls_take_only_regular_files_and_write_only_inside_the_job(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    with keeper_nodes(home, JOB) as nodes:
        job_dir = nodes.mirror.root.parent
        nodes.run(0, SETUP)  # written by "the run", after the agent started
        end_run(nodes.cluster, JOB)
        skip = [job_dir, home / "local", home / "orch.db", home / "orch.db-wal",
                home / "orch.db-shm"]  # fmt: skip
        before = _tree(tmp_path, skip)

        collected = nodes.keeper.finish(wait_s=30)

        assert _tree(tmp_path, skip) == before
        assert not (tmp_path / "x").exists() and not (home / "x").exists()
        assert any("new\\x0aline\\x09name.pt" in m for m in nodes.events("WARNING"))
        assert sorted(u.name for u in collected.installed) == sorted(
            ["step-000001", HOSTILE, "..dots", "latest"]
        )
        mirror = nodes.mirror
        files = {
            p.relative_to(mirror.root).as_posix(): p.read_bytes()
            for p in mirror.root.rglob("*")
            if p.is_file() or p.is_symlink()
        }
        assert files == {
            "step-000001/state.pt": b"weights",
            "step-000001/COMPLETE": b"",
            "latest": b"../../x",  # the pointer is data, never a path to follow
            HOSTILE: b"hostile",
            "..dots": b"dots",
        }
        assert not any(p.is_symlink() for p in job_dir.rglob("*"))
        assert mirror.latest_complete() == mirror.root / "step-000001"
        recorded = sorted(r.name for r in nodes.ledger.checkpoints(JOB))
        assert recorded == sorted(["step-000001", HOSTILE, "..dots"])  # `latest` points only


def test_a_step_dir_swapped_for_a_link_after_it_was_staged(tmp_path: Path) -> None:
    """The directory becomes a link to elsewhere on the node between staging and the pull:
    whatever arrives lands inside the mirror, and nothing else changes here."""
    home = tmp_path / "orch"
    with keeper_nodes(home, JOB) as nodes:
        job_dir = nodes.mirror.root.parent
        nodes.run(0, SETUP)
        end_run(nodes.cluster, JOB)
        wait_for_manifests(nodes, lambda manifest: manifest.done, "every agent done")
        nodes.run(0, 'cd ckpt; rm -r step-000001; ln -s "$HOME/outside/step" step-000001')
        skip = [job_dir, home / "local", home / "orch.db", home / "orch.db-wal",
                home / "orch.db-shm"]  # fmt: skip
        before = _tree(tmp_path, skip)

        nodes.keeper.collect()

        assert _tree(tmp_path, skip) == before
        assert not any(p.is_symlink() for p in job_dir.rglob("*"))
        for path in job_dir.rglob("*"):
            assert path.resolve().is_relative_to(job_dir.resolve()), path


def test_an_orch_home_with_spaces_quotes_and_percent_signs(tmp_path: Path) -> None:
    """Keys and known_hosts under such a home still reach ssh whole (through rsync's -e)."""
    home = tmp_path / "my 'orch' %d $x home"  # (the local provider refuses \" there)
    source = tmp_path / "work dir"
    source.mkdir()
    (source / "train.py").write_text("print('hi')\n")
    with keeper_nodes(home, JOB) as nodes:
        address, identity = nodes.cluster.addresses[0], nodes.cluster.identity
        run_rsync(push_argv(source, address, identity, "~/work", workdir=True), what="sync")
        assert nodes.cluster.head.run(["cat", "work/train.py"]).stdout == "print('hi')\n"
        nodes.run(0, "printf w > ckpt/weights.pt")
        end_run(nodes.cluster, JOB)
        collected = nodes.keeper.finish(wait_s=30)
        assert [u.name for u in collected.installed] == ["weights.pt"]
        assert (nodes.mirror.root / "weights.pt").read_bytes() == b"w"
