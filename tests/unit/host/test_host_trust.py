"""What a controller host's word can do to the laptop: nothing outside what it is asked for.

A job id the host prints is checked against the job-id shape before it names a folder here, and
a hand-over kit is read as bounded data, of which only the kit's named files are written, as
private regular files, inside the kit's folder."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from orchestrator.control.process.controllers import new_job_id
from orchestrator.errors import ControllerHostError
from orchestrator.host import handover, kit_archive
from orchestrator.host import record as records
from orchestrator.host.remote_jobs import job_id_of
from orchestrator.spec.ids import is_job_id

JOB = "cifar-ddp-0a1b2c"
NAMES = handover.kit_files(JOB)
HOSTILE_IDS = [
    "../../x", "../../../.ssh", "/etc", "a/b-0a1b2c", "j-0a1b2c/..", "", ".", "J-0A1B2C",
    "j-0a1b2c\x1b[2J", "j 0a1b2c", "x" * 80 + "-0a1b2c", "j-0a1b2",
]  # fmt: skip


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under `root` with its mode and a file's bytes (links not followed)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        found[str(path.relative_to(root))] = (info.st_mode, data)
    return found


# --- job ids ---------------------------------------------------------------------------------


def test_ids_orch_makes_have_the_job_id_shape() -> None:
    for name in ("a", "cifar-ddp", "x" * 63, "a-1-b"):
        assert is_job_id(new_job_id(name)), name
    assert is_job_id(JOB)


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_a_job_id_of_another_shape_from_the_host_names_nothing_here(
    tmp_path: Path, hostile: str
) -> None:
    assert not is_job_id(hostile)
    before = tree(tmp_path)
    for printed in (f"submitted\n{hostile}", json.dumps({"id": hostile})):
        with pytest.raises(ControllerHostError, match="not a job id"):
            job_id_of(printed)
    with pytest.raises(ControllerHostError, match="not a job id"):
        handover.kit_dir(tmp_path, hostile)
    with pytest.raises(ControllerHostError, match="not a job id"):
        records.add_job(tmp_path, hostile)
    assert tree(tmp_path) == before, "a hostile job id wrote something"


def test_a_job_id_of_the_right_shape_is_taken_as_printed() -> None:
    assert job_id_of(f"[orch] submitted\n{JOB}\n") == JOB
    assert job_id_of(json.dumps({"id": JOB, "state": "PENDING"})) == JOB
    with pytest.raises(ControllerHostError, match="not a job id"):
        job_id_of('{"id": 7}')


def test_only_kit_folders_of_the_job_id_shape_are_kept_jobs(tmp_path: Path) -> None:
    kits = records.host_dir(tmp_path) / "kits"
    for name in (JOB, "..x", "not-an-id"):
        (kits / name).mkdir(parents=True)
    assert handover.kept_jobs(tmp_path) == [JOB]


# --- hand-over kits --------------------------------------------------------------------------


def packed(members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> str:
    """base64 of a tar.gz of `members` (a regular member's bytes from `data`)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info in members:
            body = (data or {}).get(info.name, b"")
            if info.isreg():
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if info.isreg() else None)
    return base64.b64encode(buffer.getvalue()).decode()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def kit_of(**extra: bytes) -> dict[str, bytes]:
    return {name: f"{name} body".encode() for name in NAMES} | extra


HOSTILE_MEMBERS = {
    "dot-dot": [member(f"../../{NAMES[0]}")],
    "dot-dot inside": [member(f"jobs/{JOB}/../../../x")],
    "absolute": [member(f"/tmp/{NAMES[0]}")],
    "other name": [member(f"jobs/{JOB}/evil.sh")],
    "symlink": [member(NAMES[0], tarfile.SYMTYPE, "/etc/passwd")],
    "hardlink": [member(NAMES[0], tarfile.LNKTYPE, "/etc/passwd")],
    "char device": [member(NAMES[1], tarfile.CHRTYPE)],
    "block device": [member(NAMES[1], tarfile.BLKTYPE)],
    "fifo": [member(NAMES[1], tarfile.FIFOTYPE)],
    "folder": [member(f"jobs/{JOB}", tarfile.DIRTYPE, mode=0o777)],
    "twice": [member(NAMES[0]), member(NAMES[0])],
    "setuid file then link": [
        member(NAMES[2], mode=0o4755),
        member(NAMES[3], tarfile.SYMTYPE, "../../../../x"),
    ],  # fmt: skip
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MEMBERS))
def test_a_kit_with_anything_but_its_named_regular_files_writes_nothing(
    tmp_path: Path, case: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    before = tree(tmp_path)
    with pytest.raises(ControllerHostError, match="refused"):
        kit_archive.unpack(packed(HOSTILE_MEMBERS[case], kit_of()), handover.kit_dir(home, JOB),
                           NAMES)  # fmt: skip
    assert tree(tmp_path) == before, "a refused kit wrote something"


def test_a_kit_too_big_or_not_a_kit_writes_nothing(tmp_path: Path) -> None:
    folder = handover.kit_dir(tmp_path, JOB)
    big = kit_of(**{NAMES[0]: b"x" * (kit_archive.MAX_FILE_BYTES + 1)})
    many = [member(NAMES[0])] * (kit_archive.MAX_MEMBERS + 1)
    bomb = base64.b64encode(gzip.compress(b"\0" * (kit_archive.MAX_TAR_BYTES + 1024))).decode()
    for sent in (packed([member(NAMES[0])], big), packed(many), bomb, "not base64 !",
                 base64.b64encode(b"not gzip").decode(),
                 "A" * (kit_archive.MAX_PACKED_CHARS + 4)):  # fmt: skip
        with pytest.raises(ControllerHostError, match="refused"):
            kit_archive.unpack(sent, folder, NAMES)
    assert list(tmp_path.iterdir()) == []


def test_a_kit_is_written_private_whatever_modes_the_host_gave(tmp_path: Path) -> None:
    folder = handover.kit_dir(tmp_path, JOB)
    members = [member(name, mode=0o4777) for name in NAMES]
    assert kit_archive.unpack(packed(members, kit_of()), folder, NAMES) == sorted(NAMES)
    assert handover.complete(tmp_path, JOB)
    for path in folder.rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert (folder / NAMES[0]).read_bytes() == f"{NAMES[0]} body".encode()


def test_a_link_where_a_kit_folder_or_file_should_be_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "job.json").write_text("mine")
    modes = tree(outside)
    folder = handover.kit_dir(tmp_path / "home", JOB)
    (folder / "jobs").mkdir(parents=True)
    os.symlink(outside, folder / "jobs" / JOB)  # a link planted where a folder goes
    with pytest.raises(ControllerHostError, match="not a folder"):
        kit_archive.unpack(packed([member(NAMES[0])], kit_of()), folder, NAMES)
    os.unlink(folder / "jobs" / JOB)
    (folder / "jobs" / JOB).mkdir()
    os.symlink(outside / "job.json", folder / NAMES[0])  # and where a file goes
    with pytest.raises(ControllerHostError, match="not a regular file"):
        kit_archive.unpack(packed([member(NAMES[0])], kit_of()), folder, NAMES)
    assert tree(outside) == modes, "the kit wrote or chmodded through a link"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755
