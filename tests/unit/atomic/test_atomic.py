"""Writing a file whole or not at all (`orchestrator.atomic`), and the fence that keeps it the
one way the controller side replaces a file."""

from __future__ import annotations

import ast
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.atomic import install, write_atomic

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "orchestrator"

# A writer that stops for good at one point of `write_atomic` (an audit event: "os.chmod" of the
# new temporary file, before any byte is in it; "os.rename", after it is written and flushed but
# before it replaces the target), says so, and waits there to be killed.
STOPPING_WRITER = """
import sys, time
from pathlib import Path
from orchestrator.atomic import write_atomic

target, stop_at = Path(sys.argv[1]), sys.argv[2]

def hook(event, args):
    if event == stop_at and (event == "os.chmod" or str(args[0]).endswith(".tmp")):
        print("stopped", flush=True)
        time.sleep(60)

sys.addaudithook(hook)
write_atomic(target, b"new" * 1_000_000, private=True)
"""


@pytest.mark.parametrize("stop_at", ["os.chmod", "os.rename"])
def test_a_writer_killed_before_the_rename_leaves_the_old_file_whole(
    tmp_path: Path, stop_at: str
) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old\n" * 1000)
    writer = subprocess.Popen(
        [sys.executable, "-c", STOPPING_WRITER, str(target), stop_at],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "stopped\n", "the writer never reached its stop"
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    assert target.read_bytes() == b"old\n" * 1000
    leftovers = [p for p in tmp_path.iterdir() if p != target]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".state.json.")
    assert leftovers[0].name.endswith(".tmp")
    written = b"new" * 1_000_000 if stop_at == "os.rename" else b""
    assert leftovers[0].read_bytes() == written


def test_a_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    write_atomic(target, "first")
    write_atomic(target, b"second")
    assert target.read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(TypeError):
        # the temporary is written, then setting its times fails
        write_atomic(target, "new", times_ns=("a", "b"))  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_private_file_is_0600_whatever_the_umask_and_the_old_mode(tmp_path: Path) -> None:
    target = tmp_path / "secrets.json"
    target.write_text("{}")
    target.chmod(0o644)
    old = os.umask(0)
    try:
        write_atomic(target, "{}", private=True)
        private = stat.S_IMODE(target.stat().st_mode)
        write_atomic(tmp_path / "plain", "x")
        plain = stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    finally:
        os.umask(old)
    assert private == 0o600
    assert plain == 0o666  # a file that is not private gets what the umask allows


def test_a_file_that_is_not_private_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "plain", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640


def test_a_link_at_the_target_is_replaced_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not yours")
    target = tmp_path / "target"
    target.symlink_to(elsewhere)
    write_atomic(target, "mine", private=True)
    assert not target.is_symlink() and target.read_text() == "mine"
    assert elsewhere.read_text() == "not yours"


def test_given_times_are_the_new_files_times(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    write_atomic(target, "{}", times_ns=(1_000_000_000, 2_000_000_000))
    assert target.stat().st_mtime_ns == 2_000_000_000


def test_install_puts_a_finished_file_in_place(tmp_path: Path) -> None:
    built, target = tmp_path / ".ledger.new", tmp_path / "ledger"
    built.write_text("built")
    target.write_text("old")
    install(built, target)
    assert target.read_text() == "built" and not built.exists()


# --- the fence --------------------------------------------------------------------------------

# Modules that rename something other than a file's new content, and why.
RENAMES: dict[str, str] = {
    "orchestrator/atomic.py": "the one atomic writer",
    "orchestrator/cluster/log_files.py": "rotates kept logs (log -> log.1 -> log.2)",
    "orchestrator/cluster/checkpoints/mirror.py": "installs hard links of fetched files and "
    "swaps whole checkpoint folders; nothing is written there",
}


def renames(source: str) -> list[int]:
    """Lines of `source` that rename a file: `os.replace`/`os.rename`, or a path's
    `.replace(target)`/`.rename(target)` (one argument; `str.replace` takes two)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("replace", "rename"):
            continue
        owner = node.func.value
        named = owner.id if isinstance(owner, ast.Name) else None
        path_method = len(node.args) == 1 and not node.keywords and named != "dataclasses"
        if named == "os" or path_method:
            lines.append(node.lineno)
    return lines


def package_renames() -> dict[str, list[int]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("orchestrator/node/"):  # programs sent to nodes: stdlib only
            continue
        lines = renames(path.read_text())
        if lines:
            found[relative] = lines
    return found


def test_only_the_atomic_writer_replaces_a_file_with_new_content() -> None:
    breaches = {m: lines for m, lines in package_renames().items() if m not in RENAMES}
    assert not breaches, f"write through orchestrator.atomic.write_atomic instead: {breaches}"


def test_every_listed_rename_still_occurs() -> None:
    assert set(RENAMES) <= set(package_renames())


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("os.replace(tmp, path)", True),
        ("os.rename(a, b)", True),
        ("tmp.replace(path)", True),
        ("path.with_suffix('.tmp').rename(path)", True),
        ("text.replace('a', 'b')", False),
        ("dataclasses.replace(record, jobs=[])", False),
        ("dataclasses.replace(record)", False),
    ],
)
def test_the_fence_tells_a_rename_from_other_replaces(source: str, caught: bool) -> None:
    assert bool(renames(source)) is caught
