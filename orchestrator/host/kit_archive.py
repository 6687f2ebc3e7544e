"""A hand-over kit as the host sends it, read without trusting the host: a bounded tar of the
kit's named files, written into the kit's folder as private regular files.

The host packs the kit's files as a gzipped tar, in base64, on its stdout (`handover.fetch`).
`unpack` takes from it only the files whose names the kit expects (`handover.kit_files` of a
checked job id), each a regular file of at most `MAX_FILE_BYTES`, and refuses the whole kit,
writing nothing, at anything else: a link, a device, a folder, an absolute name, a `..`, a
name the kit does not have, a member twice, more than `MAX_MEMBERS` members, or more than
`MAX_TAR_BYTES` once unzipped. The files are written 0600 in 0700 folders that this writes
itself (never through a link: a link where a folder or file should be is refused), each one
atomically, with modes this sets, never the archive's.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Collection
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.errors import ControllerHostError

MAX_FILE_BYTES = 1024 * 1024  # a job's record, secrets or key file; each is a few KiB
MAX_MEMBERS = 16  # the kit has four files
MAX_TAR_BYTES = 4 * 1024 * 1024  # the whole tar, unzipped
MAX_PACKED_CHARS = 2 * MAX_TAR_BYTES  # its gzip in base64 (gzip can grow incompressible data)
REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


def _refuse(why: str) -> ControllerHostError:
    return ControllerHostError(
        f"the controller host sent a hand-over kit that is refused: {why}; nothing of it was "
        "written",
        hint="the host's orch may be broken or the host compromised: check it before you "
        "hand it anything more (`orch controller logs` shows its daemon's log)",
    )


def read_members(packed: str, names: Collection[str]) -> dict[str, bytes]:
    """The files of `names` that the kit `packed` (base64 of a tar.gz) holds, by name; raises
    `ControllerHostError` for a kit that is unreadable, too big or holds anything else (see
    the module docstring). Pure."""
    text = packed.strip()
    if len(text) > MAX_PACKED_CHARS:
        raise _refuse(f"{len(text)} characters of base64, more than {MAX_PACKED_CHARS}")
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise _refuse(f"not base64 ({exc})") from exc
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unzipped:
            tar_bytes = unzipped.read(MAX_TAR_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise _refuse(f"not gzip ({exc})") from exc
    if len(tar_bytes) > MAX_TAR_BYTES:
        raise _refuse(f"more than {MAX_TAR_BYTES} bytes once unzipped")
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise _refuse(f"more than {MAX_MEMBERS} members")
                files[member.name] = _member_bytes(tar, member, names, files)
    except tarfile.TarError as exc:
        raise _refuse(f"not a tar archive ({exc})") from exc
    return files


def _member_bytes(
    tar: tarfile.TarFile, member: tarfile.TarInfo, names: Collection[str], seen: Collection[str]
) -> bytes:
    name = member.name
    if name not in names:
        raise _refuse(f"a member {name[:200]!r} that is not one of the kit's files")
    if name in seen:
        raise _refuse(f"{name} twice")
    if member.type not in REGULAR:
        raise _refuse(f"{name} is not a regular file (tar type {member.type!r})")
    if member.size > MAX_FILE_BYTES:
        raise _refuse(f"{name} of {member.size} bytes, more than {MAX_FILE_BYTES}")
    handle = tar.extractfile(member)
    data = handle.read(MAX_FILE_BYTES + 1) if handle is not None else b""
    if len(data) != member.size:
        raise _refuse(f"{name} is cut short")
    return data


def private_folder(folder: Path) -> None:
    """Make `folder` a real folder of mode 0700 (made when missing); a link or anything but
    a folder there is refused."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        os.mkdir(folder, 0o700)
        info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):  # a link to a folder is not one
        raise _refuse(f"{folder} is not a folder of this machine (a link?)")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)


def make_private(folder: Path) -> None:
    """`private_folder`, its missing parents made 0700 too."""
    old = os.umask(0o077)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        private_folder(folder)
    finally:
        os.umask(old)


def write_private(folder: Path, files: dict[str, bytes]) -> list[str]:
    """Write `files` (relative name -> bytes: names this machine chose, or checked by
    `read_members`) under `folder`, each 0600 in 0700 folders, atomically; returns the names
    written."""
    make_private(folder)
    old = os.umask(0o077)
    try:
        for name, data in files.items():
            parent = folder
            *dirs, leaf = name.split("/")
            for part in dirs:
                parent = parent / part
                private_folder(parent)
            target = parent / leaf
            if target.is_symlink() or (target.exists() and not target.is_file()):
                raise _refuse(f"{target} is not a regular file of this machine (a link?)")
            write_atomic(target, data, private=True)  # a link there is replaced, not followed
    finally:
        os.umask(old)
    return sorted(files)


def unpack(packed: str, folder: Path, names: Collection[str]) -> list[str]:
    """Read the kit `packed` (`read_members`) and write its files into `folder`
    (`write_private`); returns the names written. Nothing is written when it is refused."""
    return write_private(folder, read_members(packed, names))
