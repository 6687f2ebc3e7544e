"""The capture rule of the checkpoint agent: a file saved faster than the quiet time is still
captured, each copy one whole save; a copy is refused when it is cut short or mixes two saves;
and a file that goes without a copy is reported, never kept quiet.

The agent runs in this process on a real directory, a thread rewriting its file in place as a
script does; the zip files are what `torch.save` writes (stored entries, a central directory
last), made here with `zipfile` so that no torch is needed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
import zipfile
from pathlib import Path

import pytest

from orchestrator.node.checkpoint_agent import Agent
from orchestrator.node.checkpoint_capture import UNCAPTURED_TIMES, History
from orchestrator.node.checkpoint_whole import finished, whole
from tests.support import agent_dirs
from tests.support.waiting import wait_until


def make_agent(tmp_path: Path, **extra: object) -> Agent:
    """An agent whose quiet time (30 s) never passes here: only taking at a look captures."""
    return agent_dirs.make_agent(tmp_path, **{"quiet_s": 30.0, **extra})


def zip_save(epoch: int, size: int = 200_000) -> bytes:
    """A torch.save-like zip: a pickle entry and a tensor entry, stored, the same size for
    every epoch (as a model's saves are), and the same bytes for the same epoch (the entries'
    time is fixed, not the clock's)."""
    buffer = io.BytesIO()
    stamp = (2026, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        pickle = zipfile.ZipInfo("archive/data.pkl", stamp)
        archive.writestr(pickle, json.dumps({"epoch": epoch}).ljust(64).encode())
        archive.writestr(zipfile.ZipInfo("archive/data/0", stamp), bytes([epoch % 251]) * size)
    return buffer.getvalue()


def safetensors_save(epoch: int, size: int = 200_000) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]},
                         "__metadata__": {"epoch": str(epoch)}}).encode()  # fmt: skip
    return len(header).to_bytes(8, "little") + header + bytes([epoch % 251]) * size


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


class Writer(threading.Thread):
    """Rewrites `path` in place every `every_s` (truncate, then write in pieces, as
    `torch.save` to a path does), recording the digest of every save."""

    def __init__(self, path: Path, save, every_s: float) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.path, self.save, self.every_s = path, save, every_s
        self.saved: set[str] = set()
        self.count = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.count += 1
            body = self.save(self.count)
            self.saved.add(digest(body))
            with open(self.path, "r+b" if self.path.exists() else "wb") as handle:
                handle.truncate(0)
                for start in range(0, len(body), 50_000):
                    handle.write(body[start : start + 50_000])
                    handle.flush()
                    time.sleep(0.002)
            self.stop.wait(self.every_s)


def watch_while_writing(a: Agent, writer: Writer, seconds: float) -> set[str]:
    """Run the agent's looks beside `writer` for `seconds`; the digests of the copies it staged,
    each checked against the staged object's bytes."""
    rel = writer.path.name
    seen: set[str] = set()
    writer.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            a.pass_once(ended=False)
            staged = a.files.get(rel, {}).get("staged")
            if staged is not None:
                held = (Path(a.objects) / staged["object"]).read_bytes()
                assert digest(held) == staged["digest"]
                seen.add(staged["digest"])
            time.sleep(0.05)
    finally:
        writer.stop.set()
        writer.join()
    return seen


@pytest.mark.parametrize(
    ("name", "save"), [("last.ckpt", zip_save), ("model.safetensors", safetensors_save)]
)
def test_a_checkpoint_saved_faster_than_the_quiet_time_is_captured_whole(
    tmp_path: Path, name: str, save
) -> None:  # noqa: ANN001
    """Saved every 0.15 s, never quiet for the 30 s the quiet rule wants: still captured,
    many times over, and every copy is exactly one save."""
    a = make_agent(tmp_path)
    writer = Writer(tmp_path / "ckpt" / name, save, every_s=0.15)
    seen = watch_while_writing(a, writer, seconds=3.0)
    assert seen <= writer.saved, "a staged copy that no save wrote (torn or mixed)"
    assert len(seen) >= 4, (len(seen), writer.count)


def test_with_taking_at_a_look_off_a_file_saved_nonstop_waits_for_quiet(tmp_path: Path) -> None:
    """The quiet rule alone (the switch off): the same saves are never taken."""
    a = make_agent(tmp_path, take_at_look=False)
    writer = Writer(tmp_path / "ckpt" / "last.ckpt", zip_save, every_s=0.15)
    assert watch_while_writing(a, writer, seconds=1.5) == set()


def test_a_file_of_a_format_that_cannot_tell_is_taken_only_once_quiet(tmp_path: Path) -> None:
    a = make_agent(tmp_path, quiet_s=0.3)
    path = tmp_path / "ckpt" / "state.bin"
    path.write_bytes(b"raw bytes, no end marker")
    assert not a.pass_once(ended=False)
    assert a.files["state.bin"]["staged"] is None
    time.sleep(0.35)  # the subject: quiet for longer than quiet_s
    assert a.pass_once(ended=False)
    assert a.files["state.bin"]["staged"] is not None


def test_a_file_renamed_into_place_is_staged_as_a_link(tmp_path: Path) -> None:
    """A script that saves to a temporary and renames it over the checkpoint: once that is
    seen, each new version is held by a hard link (no copy), and the one before stays whole."""
    a = make_agent(tmp_path)
    path = tmp_path / "ckpt" / "last.ckpt"
    copies = []
    for epoch in range(1, 4):
        (tmp_path / "ckpt" / ".tmp-save").write_bytes(zip_save(epoch))
        (tmp_path / "ckpt" / ".tmp-save").replace(path)
        a.pass_once(ended=False)
        copies.append(a.files["last.ckpt"]["staged"])
    assert [c["linked"] for c in copies] == [False, True, True]
    assert os.stat(Path(a.objects) / copies[-1]["object"]).st_ino == path.stat().st_ino
    previous = (Path(a.objects) / copies[1]["object"]).read_bytes()
    assert previous == zip_save(2)


# --- whole or not -----------------------------------------------------------------------


def test_a_zip_whose_end_record_ends_the_file_is_finished(tmp_path: Path) -> None:
    data = zip_save(1)
    for name, body, expected in [
        ("whole.pt", data, True),
        ("cut.pt", data[: len(data) // 2], False),  # a save in progress
        ("cut-end.pt", data[:-5], False),
        ("trailing.pt", data + b"\0" * 100, False),  # longer than its directory says
    ]:
        (tmp_path / name).write_bytes(body)
        assert finished(str(tmp_path / name), name) is expected, name


def test_a_zip_mixing_two_saves_is_not_whole(tmp_path: Path) -> None:
    """The first half of one save and the second half of the next (a write during the copy
    that left size and mtime as they were): every entry is checked against its CRC-32."""
    old, new = zip_save(1), zip_save(2)
    assert len(old) == len(new)
    mixed = old[: len(old) // 2] + new[len(new) // 2 :]
    (tmp_path / "mixed.pt").write_bytes(mixed)
    assert finished(str(tmp_path / "mixed.pt"), "mixed.pt")  # its end looks right ...
    assert whole(str(tmp_path / "mixed.pt"), "mixed.pt") is False  # ... its entries do not
    (tmp_path / "new.pt").write_bytes(new)
    assert whole(str(tmp_path / "new.pt"), "new.pt") is True


def test_a_zip_entry_renamed_in_its_local_header_is_not_whole(tmp_path: Path) -> None:
    data = bytearray(zip_save(1))
    at = data.find(b"archive/data.pkl")  # the first local header's name
    data[at : at + 7] = b"ARCHIVE"
    (tmp_path / "odd.pt").write_bytes(bytes(data))
    assert whole(str(tmp_path / "odd.pt"), "odd.pt") is False


def test_a_safetensors_file_is_whole_when_it_holds_what_its_header_says(tmp_path: Path) -> None:
    data = safetensors_save(1)
    for name, body, expected in [
        ("ok.safetensors", data, True),
        ("short.safetensors", data[:-10], False),
        ("header.safetensors", data[:20], False),
        ("garbage.safetensors", b"\xff" * 64, False),
    ]:
        (tmp_path / name).write_bytes(body)
        assert whole(str(tmp_path / name), name) is expected, name


def test_other_formats_cannot_tell(tmp_path: Path) -> None:
    (tmp_path / "state.bin").write_bytes(b"\x80\x04K\x01.")  # a plain pickle
    assert finished(str(tmp_path / "state.bin"), "state.bin") is None
    assert whole(str(tmp_path / "state.bin"), "state.bin") is None
    (tmp_path / "link.pt").symlink_to(tmp_path / "state.bin")
    assert finished(str(tmp_path / "link.pt"), "link.pt") is False  # never followed


# --- none captured ------------------------------------------------------------------------


class Looks:
    """Stat results of one file, version after version."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, size: int, *, new_inode: bool = False) -> os.stat_result:
        if new_inode:
            self.path.with_suffix(".new").write_bytes(b"x" * size)
            self.path.with_suffix(".new").replace(self.path)
        else:
            with open(self.path, "r+b" if self.path.exists() else "wb") as handle:
                handle.truncate(0)
                handle.write(b"x" * size)
        return os.stat(self.path)


def test_a_file_rewritten_without_a_copy_is_reported_after_several_rewrites(
    tmp_path: Path,
) -> None:
    looks = Looks(tmp_path / "snapshot.pt")
    history = History(looks.write(100), now=0.0)
    for n in range(1, UNCAPTURED_TIMES):
        history.look(looks.write(100), now=1.5 * n)
        assert history.uncaptured(now=1.5 * n, min_s=0) is None  # not yet: too few rewrites
    history.look(looks.write(100), now=1.5 * UNCAPTURED_TIMES)
    assert history.uncaptured(now=1.5 * UNCAPTURED_TIMES, min_s=60) is None  # not for 60 s
    assert history.uncaptured(now=60.0, min_s=60) == pytest.approx(1.5)
    history.captured(now=61.0)
    assert history.uncaptured(now=200.0, min_s=60) is None  # a copy: the count starts again


def test_a_file_that_only_grows_is_not_a_rewritten_checkpoint(tmp_path: Path) -> None:
    looks = Looks(tmp_path / "train.log")
    history = History(looks.write(10), now=0.0)
    for n in range(1, 20):
        with open(looks.path, "ab") as handle:
            handle.write(b"one more line\n")
        history.look(os.stat(looks.path), now=float(n))
    assert history.uncaptured(now=100.0, min_s=0) is None


def test_the_manifest_lists_a_file_going_without_a_copy_until_one_is_taken(
    tmp_path: Path,
) -> None:
    """A file rewritten nonstop in a format that cannot tell (so only a quiet file is taken):
    the agent's manifest says so, with its rewrite interval; once it is quiet and copied, the
    entry goes."""
    a = make_agent(tmp_path, quiet_s=0.5, uncaptured_min_s=0.3)
    path = tmp_path / "ckpt" / "state.bin"
    writer = Writer(path, lambda n: bytes([n % 251]) * 1000, every_s=0.05)
    watch_while_writing(a, writer, seconds=1.5)
    a.write_manifest(done=False)
    manifest = json.loads((tmp_path / "state" / "manifest.json").read_text())
    entry = manifest["uncaptured"]["state.bin"]
    assert 0 < entry["every_s"] < 0.5 and entry["ever"] is False
    assert entry["since_ns"] <= time.time_ns()

    def taken() -> bool:
        if a.files["state.bin"]["staged"] is not None:
            return True
        a.pass_once(ended=False)
        return False

    wait_until(taken, "the quiet file taken", 5, interval=0.1)
    assert a.uncaptured == {}
