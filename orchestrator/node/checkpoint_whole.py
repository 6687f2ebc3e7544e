"""Whether a checkpoint file holds one whole write, for the formats that can tell.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer.

Two formats say by themselves whether all their bytes are there:

- a zip file, what `torch.save` writes (and `.ckpt`, `.pth` files made with it): it ends with
  an end record that follows the central directory, which names every entry with its offset,
  sizes and CRC-32, and is written last;
- a `.safetensors` file: an 8-byte header length, a JSON header giving every tensor's byte
  range, then the bytes.

`finished` is the cheap look at a file that may be being written (its last bytes, or its
header): a write in progress is not finished. `whole` is the thorough check of a copy: every
zip entry is read, its local header must match the central directory and its bytes the CRC-32
recorded there, so a copy cut short or mixing two writes is refused. Both return None for any
other format: those cannot tell, and the agent waits until such a file is quiet instead.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zipfile

ZIP_MAGIC = b"PK\x03\x04"  # a local file header: how every zip file torch writes starts
ZIP_END = b"PK\x05\x06"  # the end of central directory record
ZIP_END_SIZE = 22
ZIP_MAX_COMMENT = 65535
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
READ_CHUNK = 4 * 1024 * 1024
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def file_format(head: bytes, name: str) -> str | None:
    """ "zip" or "safetensors" by a file's first bytes and name; None for any other format."""
    if head[:4] == ZIP_MAGIC:
        return "zip"
    if name.endswith(".safetensors"):
        return "safetensors"
    return None


def finished(path: str, name: str) -> bool | None:
    """Whether the file at `path` (not followed if a symlink) looks like a finished write: a
    zip whose end record ends the file, a safetensors file as long as its header says. None:
    its format cannot tell. Reads the first and last bytes only."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        try:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return False
            head = handle.read(8)
            kind = file_format(head, name)
            if kind == "zip":
                return _zip_end_ends(handle, info.st_size)
            if kind == "safetensors":
                return _safetensors_holds(handle, head, info.st_size)
            return None
        except OSError:
            return False


def whole(path: str, name: str) -> bool | None:
    """Whether the copy at `path` is one whole write (see the module docstring); None: its
    format cannot tell. Reads every byte of a zip once."""
    kind = finished(path, name)
    if not kind:
        return kind
    with open(path, "rb") as handle:
        if handle.read(4) != ZIP_MAGIC:
            return True  # safetensors: its header and length are all there is to check
    try:
        with zipfile.ZipFile(path) as archive:
            for entry in archive.infolist():
                # `open` checks the local header against the directory; reading to the end
                # checks the CRC-32 (BadZipFile when it differs).
                with archive.open(entry) as member:
                    while member.read(READ_CHUNK):
                        pass
    except (NotImplementedError, RuntimeError):
        return None  # a compression or an encryption this Python cannot read
    except Exception:  # noqa: BLE001 - whatever zipfile raises on bad bytes means "not whole"
        return False
    return True


def looks_whole(path: str, name: str) -> bool:
    """False when `whole` finds the copy at `path` cut short or mixed; True otherwise,
    formats that cannot tell included."""
    return whole(path, name) is not False


def _zip_end_ends(handle, size: int) -> bool:  # noqa: ANN001 - a binary file
    """Whether the file's last bytes are an end of central directory record, its comment
    included, that ends exactly where the file does."""
    if size < ZIP_END_SIZE:
        return False
    handle.seek(size - ZIP_END_SIZE)
    last = handle.read(ZIP_END_SIZE)
    if last[:4] == ZIP_END and last[20:22] == b"\0\0":
        return True  # no comment (what torch writes): the last 22 bytes are all there is to read
    span = min(size, ZIP_END_SIZE + ZIP_MAX_COMMENT)
    handle.seek(size - span)
    tail = handle.read(span)
    at = tail.rfind(ZIP_END)
    while at >= 0:
        if len(tail) - at >= ZIP_END_SIZE:
            (comment,) = struct.unpack("<H", tail[at + 20 : at + 22])
            if at + ZIP_END_SIZE + comment == len(tail):
                return True
        at = tail.rfind(ZIP_END, 0, at)
    return False


def _safetensors_holds(handle, head: bytes, size: int) -> bool:  # noqa: ANN001 - a binary file
    """Whether a safetensors file holds every byte its header gives a tensor."""
    if len(head) < 8:
        return False
    (length,) = struct.unpack("<Q", head)
    if length > size - 8 or length > SAFETENSORS_MAX_HEADER:
        return False
    handle.seek(8)
    try:
        header = json.loads(handle.read(length))
        ends = [
            int(v["data_offsets"][1])
            for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
        ]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return False
    return 8 + length + max(ends, default=0) <= size
