"""The checkpoint agent: runs detached on every node of a job and makes checkpoints safe to copy.

orch sends this file to the node and starts it (`watch`) after the sync and before the run. It
looks at the job's checkpoint directory every `interval_s` seconds and stages what the run
writes there:

- A file is taken once the agent has seen it unchanged for `quiet_s` (its size, mtime, ctime
  and inode, on looks that far apart: a file's mtime alone can lag a truncation by a fraction
  of a second), at once when the run has ended. Its
  staged copy is kept only if the file did not change while it was copied: the same inode,
  size, mtime and ctime before and after, decided here, on the node. A zip file (what
  `torch.save` writes) or a `.safetensors` file must also be whole. So a staged copy is never
  torn and never mixes two writes, however often the script saves in place.
- Files of a directory checkpoint (under `step-N/`, a DCP `.metadata`, DCP shards `__R_I.distcp`,
  a directory holding `COMPLETE` or `.metadata`) are written once, so they are staged as hard
  links. Any other file is copied (a reflink where the filesystem can), because scripts rewrite
  such files in place. A linked copy that changes later is dropped and staged again.
- Staged copies live in `<state>/objects/<name>`. The previous copy of a file is kept until
  the one after it is staged.
- Files present when the agent first started are left alone while unchanged: what orch synced
  (code, configs) and the checkpoints orch put back (`restored` in the config, which are
  reported as staged without a copy). So are temporaries (`.tmp*`, `*.tmp`), `__pycache__`,
  `*.pyc`, `*.egg-info` and `.git`. Symlinks are never followed. A file whose name holds a
  control character, or is too long (`refused_name`), is not taken: the manifest's problems
  say so.

After every change it replaces `<state>/manifest.json` atomically and appends the new
generation number to `<state>/events`, which the controller follows. With a store configured,
every staged copy is uploaded to `<prefix>/<job>/<path>@<sha16>` (several at a time; multipart
on S3), and the manifest says which are stored. Once the run has ended, the agent stages what
is left, finishes its uploads, writes `"done": true` and exits.

`restore` (run by the controller before a start) downloads files from the store into the
checkpoint directory, several at a time, and checks every file's digest (BLAKE2b-256, see
`new_digest`) before it moves the file into place.

Stdlib only, Python 3.8 or newer (boto3 for an `s3://` store); it never imports torch.

    python3 checkpoint_agent.py watch --config agent.json
    python3 checkpoint_agent.py restore < plan.json
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import stat
import struct
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
EVENTS = "events"
BASELINE = "baseline.json"
OBJECTS = "objects"
QUIET_S = 1.0  # a file unchanged this long has been written (torch.save writes in one go)
INTERVAL_S = 0.5
CHUNK = 4 * 1024 * 1024
FICLONE = 0x40049409  # ioctl: share the blocks of another file (btrfs, xfs); else a copy
COMPLETE_MARKER = "COMPLETE"
DCP_METADATA = ".metadata"
STEP_DIR = re.compile(r"^step-\d+$")
DCP_SHARD = re.compile(r"^__\d+_\d+\.distcp$")
SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1: NUL, newlines, terminal escapes
MAX_NAME_BYTES = 255  # one part of a path (NAME_MAX)
MAX_PATH_BYTES = 2048  # a path under the checkpoint directory (the mirror's folder adds its own)
UPLOAD_WORKERS = 4
RESTORE_WORKERS = 8
UPLOAD_RETRY_S = (2.0, 5.0, 15.0, 30.0, 60.0)
GIVE_UP_UPLOADS_S = 300.0  # after the run ended: stop retrying a failing store after this
NO_RUN_EXIT_S = 3600.0  # no run was started this long after the agent: nobody wants it


# --- what is a checkpoint file ---------------------------------------------------------------


def refused_name(rel: str) -> str | None:
    """Why orch takes no file by this name (here and on the controller alike), or None: the
    name holds a control character (NUL, a newline, a terminal escape), or is longer than
    every file system takes."""
    if CONTROL.search(rel):
        return "its name holds control characters"
    parts = [part.encode("utf-8", "surrogateescape") for part in rel.split("/")]
    if sum(len(part) + 1 for part in parts) > MAX_PATH_BYTES + 1 or any(
        len(part) > MAX_NAME_BYTES for part in parts
    ):
        return "its name is too long"
    return None


def shown(text: str, limit: int = 160) -> str:
    """`text` safe to print: control characters as `\\xNN`, at most `limit` characters."""
    escaped = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def skipped(rel: str) -> bool:
    """Whether a path under the checkpoint directory is never staged: not canonical or not
    UTF-8, a name orch refuses (`refused_name`), a temporary, or build and tool output that is
    no checkpoint."""
    if not canonical(rel) or refused_name(rel) is not None:
        return True
    parts = rel.split("/")
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the node: no name to ask for it by
        return True
    if any(part.startswith(".tmp") for part in parts):
        return True
    if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts[:-1]):
        return True
    return parts[-1].endswith((".tmp", ".pyc"))


def written_once(rel: str, marked_dirs: set[str]) -> bool:
    """Whether a file belongs to a directory checkpoint (written once: staged as a link)."""
    parts = rel.split("/")
    parent = "/".join(parts[:-1])
    return (
        (len(parts) > 1 and STEP_DIR.match(parts[0]) is not None)
        or DCP_SHARD.match(parts[-1]) is not None
        or parts[-1] == DCP_METADATA
        or parent in marked_dirs
    )


def scan(
    root: str, exclude: set[str], refused: dict[str, str] | None = None
) -> dict[str, os.stat_result]:
    """Every regular file under `root` that may be a checkpoint, by '/'-separated relative
    path; symlinks are neither followed nor returned, `exclude` (absolute paths) is skipped.
    Names orch refuses go to `refused` (name -> why) instead."""
    found: dict[str, os.stat_result] = {}
    if not os.path.isdir(root):
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [
            d
            for d in dirnames
            if not (d in SKIPPED_DIRS or d.startswith(".tmp") or d.endswith(".egg-info"))
            and os.path.join(dirpath, d) not in exclude
        ]
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            why = refused_name(rel)
            if why is not None and refused is not None:
                refused[rel] = why
            if skipped(rel):
                continue
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[rel] = info
    return found


def version_of(info: os.stat_result) -> list[int]:
    """What identifies one version of a file's content: size and mtime (ns)."""
    return [info.st_size, info.st_mtime_ns]


def _identity(info: os.stat_result) -> tuple[int, ...]:
    """What must not move while a file is copied: any write changes mtime or ctime."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def object_name(rel: str, digest: str) -> str:
    """The staged copy's file name: one per path and content, hex only."""
    return hashlib.sha256(f"{rel}\0{digest}".encode()).hexdigest()


def store_key(prefix: str, job_id: str, rel: str, digest: str) -> str:
    """Where a file's version lives in the store: the path, then its content's first 16 hex."""
    base = "/".join(p for p in (prefix.strip("/"), job_id) if p)
    return f"{base}/{rel}@{digest[:16]}"


# --- whole files ---------------------------------------------------------------------------


def looks_whole(path: str, name: str) -> bool:
    """False for a zip (torch.save) without its central directory, or a safetensors file whose
    header promises more bytes than it holds: a write that was cut short."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if head[:4] == b"PK\x03\x04":
            return zipfile.is_zipfile(path)
        if not name.endswith(".safetensors"):
            return True
        if len(head) < 8:
            return False
        (length,) = struct.unpack("<Q", head)
        size = os.fstat(handle.fileno()).st_size
        if length > size - 8 or length > 100 * 1024 * 1024:
            return False
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return False
    ends = [
        int(v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
    ]
    return 8 + length + max(ends, default=0) <= size


# --- DCP metadata: which files a sharded checkpoint is made of --------------------------------


class _Stub:
    """Stands in for any class a pickle names: takes whatever it is given, runs nothing.

    Unpickling may make one without calling `__init__` (NEWOBJ), hence the class defaults."""

    args: tuple = ()
    state: object = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args
        self.state = kwargs or None

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __setitem__(self, key: object, value: object) -> None:
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: object) -> None:
        self.__dict__.setdefault("elements", []).append(value)

    def extend(self, values: object) -> None:
        self.__dict__.setdefault("elements", []).extend(values)  # type: ignore[arg-type]


_SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "list", "dict", "tuple", "bytearray", "bytes", "slice", "complex",
     "int", "float", "str", "bool", "range"}
)  # fmt: skip


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        return type(name, (_Stub,), {"__module__": "orch_stub." + module})


def dcp_files(metadata: bytes) -> dict[str, int] | None:
    """The files a DCP `.metadata` says the checkpoint holds, each with the least size it
    must have; None when the bytes cannot be read as one. Nothing in the pickle is run: every
    class it names is a stand-in."""
    try:
        root = _StubUnpickler(io.BytesIO(metadata)).load()
    except Exception:  # noqa: BLE001 - any unreadable pickle means "unknown"
        return None
    files: dict[str, int] = {}
    seen: set[int] = set()
    todo = [root]
    while todo and len(seen) < 2_000_000:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            path = item.get("relative_path")
            if isinstance(path, str):
                end = item.get("offset", 0), item.get("length", 0)
                if all(isinstance(v, int) for v in end):
                    files[path] = max(files.get(path, 0), end[0] + end[1])
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):  # noqa: UP038 - runs on Python 3.8
            todo.extend(item)
        elif isinstance(item, _Stub):
            todo.extend([item.args, item.state, *item.__dict__.values()])
    valid = {p: n for p, n in files.items() if "/" not in p and not skipped(p)}
    return valid or None


# --- staging ---------------------------------------------------------------------------------


def new_digest() -> hashlib._Hash:  # type: ignore[name-defined]
    """The content digest of checkpoint files: BLAKE2b-256 (`b2sum -l 256` prints it). It runs
    at about twice SHA-256's speed on CPUs without SHA instructions, the Cascade Lake nodes of
    many GPU instance types among them, and every staged and restored byte is hashed."""
    return hashlib.blake2b(digest_size=32)


def _hash_fd(fd: int, out: int | None) -> str:
    """The digest (`new_digest`) of what `fd` holds from its start, also written to `out`."""
    digest = new_digest()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        count = os.readv(fd, [buffer])
        if not count:
            return digest.hexdigest()
        digest.update(view[:count])
        if out is not None:
            written = 0
            while written < count:
                written += os.write(out, view[written:count])


def file_digest(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return _hash_fd(fd, None)
    finally:
        os.close(fd)


def stage(src: str, rel: str, objects_dir: str, *, link: bool, tag: str) -> dict | str:
    """Stage one file into `objects_dir`; the staged entry, or why it was not taken.

    With `link`, a hard link (the file is written once); otherwise a copy, a reflink where the
    filesystem can. Either way the content is hashed, and the result is kept only if the file
    did not change meanwhile and looks whole."""
    tmp = os.path.join(objects_dir, f".tmp-{tag}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return f"cannot open: {exc.strerror}"
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return "not a regular file"
        linked = False
        if link:
            try:
                os.link(src, tmp, follow_symlinks=False)
                linked = os.lstat(tmp).st_ino == before.st_ino
            except OSError:
                linked = False
            if linked:
                before = os.fstat(fd)  # the new link moved the ctime
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        if linked:
            digest = _hash_fd(fd, None)
        else:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                cloned = False
                with contextlib.suppress(OSError, ImportError):
                    import fcntl

                    fcntl.ioctl(out, FICLONE, fd)
                    cloned = True
                digest = _hash_fd(fd, None if cloned else out)
                # The copy looks like the file: its permissions and mtime travel with it.
                os.fchmod(out, stat.S_IMODE(before.st_mode))
                os.utime(out, ns=(before.st_atime_ns, before.st_mtime_ns))
            finally:
                os.close(out)
        after = os.fstat(fd)
        try:
            named = os.lstat(src)
        except OSError:
            named = None
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return f"staging failed: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if named is None or not (_identity(before) == _identity(after) == _identity(named)):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return "changed while it was copied"
    if not looks_whole(tmp, rel.rsplit("/", 1)[-1]):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return "not whole (a write cut short)"
    name = object_name(rel, digest)
    final = os.path.join(objects_dir, name)
    os.replace(tmp, final)
    ctime_ns = before.st_ctime_ns
    if linked:  # the rename moved the shared inode's ctime once more
        placed = os.lstat(final)
        if [placed.st_size, placed.st_mtime_ns] != [before.st_size, before.st_mtime_ns]:
            with contextlib.suppress(OSError):
                os.unlink(final)
            return "changed while it was copied"
        ctime_ns = placed.st_ctime_ns
    return {
        "digest": digest,
        "size": before.st_size,
        "mtime_ns": before.st_mtime_ns,
        "ctime_ns": ctime_ns,
        "object": name,
        "linked": linked,
        "stored": None,
        "restored": False,
    }


# --- stores ----------------------------------------------------------------------------------


class StoreError(Exception):
    pass


def parse_store(url: str) -> tuple[str, str, str]:
    """(scheme, bucket or root directory, key prefix) of `s3://bucket/prefix` or `file:///dir`."""
    if url.startswith("s3://"):
        bucket, _, prefix = url[5:].partition("/")
        return "s3", bucket, prefix.strip("/")
    if url.startswith("file://"):
        return "file", url[7:].rstrip("/") or "/", ""
    raise StoreError(f"unknown store {url!r}")


class FileStore:
    """A directory any node can reach (a shared mount); keys are relative paths under it."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def upload(self, path: str, key: str) -> None:
        dst = self._path(key)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = f"{dst}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            shutil.copyfile(path, tmp)
            os.replace(tmp, dst)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"{self.root}: {exc.strerror or exc}") from exc

    def download(self, key: str, path: str) -> str:
        """Copy the object to `path`; its digest. The kernel copies while this thread hashes the
        object (it never changes: keys are per version), so the two overlap."""
        source = self._path(key)
        try:
            with ThreadPoolExecutor(max_workers=1) as pool:
                copied = pool.submit(shutil.copyfile, source, path)
                digest = file_digest(source)
                copied.result()
        except OSError as exc:
            raise StoreError(f"{key}: {exc.strerror or exc}") from exc
        return digest


class S3Store:
    """A bucket reached with boto3: the node's own credentials (an instance profile), or the
    ones the config hands over where the provider has none to give."""

    def __init__(self, bucket: str, settings: dict) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config
        except ImportError as exc:
            raise StoreError(
                "boto3 is not installed on this node: add `pip install boto3` to the job's setup"
            ) from exc
        creds = settings.get("credentials") or {}
        session = boto3.session.Session(
            aws_access_key_id=creds.get("access_key_id"),
            aws_secret_access_key=creds.get("secret_access_key"),
            aws_session_token=creds.get("session_token"),
            region_name=settings.get("region") or None,
        )
        self.bucket = bucket
        self.client = session.client(
            "s3",
            endpoint_url=settings.get("endpoint_url") or None,
            config=Config(retries={"max_attempts": 5, "mode": "standard"},
                          max_pool_connections=32),
        )  # fmt: skip
        self.transfer = TransferConfig(
            multipart_threshold=16 * 1024 * 1024,
            multipart_chunksize=16 * 1024 * 1024,
            max_concurrency=8,
        )

    def upload(self, path: str, key: str) -> None:
        try:
            self.client.upload_file(path, self.bucket, key, Config=self.transfer)
        except Exception as exc:  # noqa: BLE001 - boto3 raises many kinds; all mean "not stored"
            raise StoreError(f"s3://{self.bucket}/{key}: {exc}") from exc

    def download(self, key: str, path: str) -> str:
        """Download the object to `path` (in parts, in parallel); the digest of what arrived."""
        try:
            self.client.download_file(self.bucket, key, path, Config=self.transfer)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
        return file_digest(path)


def open_store(settings: dict) -> FileStore | S3Store:
    scheme, where, _prefix = parse_store(settings["url"])
    return FileStore(where) if scheme == "file" else S3Store(where, settings)


# --- watch: the agent's life beside the run --------------------------------------------------


def _home_path(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


def _write_json(path: str, document: object, mode: int = 0o644) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(document, handle, separators=(",", ":"))
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Agent:
    """The `watch` loop. Single-threaded but for uploads, which report back under `lock`."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.root = _home_path(config["checkpoint_dir"])
        self.state_dir = _home_path(config["state_dir"])
        self.run_dir = _home_path(config["run_dir"])
        self.objects = os.path.join(self.state_dir, OBJECTS)
        self.quiet_s = float(config.get("quiet_s", QUIET_S))
        self.interval_s = float(config.get("interval_s", INTERVAL_S))
        self.exclude = {os.path.abspath(_home_path(p)) for p in config.get("exclude", [])}
        self.exclude.add(os.path.abspath(self.state_dir))
        os.makedirs(self.objects, exist_ok=True)
        self.lock = threading.Lock()
        self.files: dict[str, dict] = {}  # path -> {"size", "mtime_ns", "staged", ...}
        self.older: dict[str, list[str]] = {}  # path -> previous staged objects (newest last)
        self.dcp: dict[str, dict] = {}
        self._first_seen: dict[str, tuple[tuple[int, ...], float]] = {}  # path -> (looks, since)
        self.problems: dict[str, str] = {}
        self.generation = 0
        self.dirty = True
        self.started = time.time()
        self.store_settings = config.get("store")
        self.store: FileStore | S3Store | None = None
        self.uploads = ThreadPoolExecutor(max_workers=UPLOAD_WORKERS)
        self.uploading: set[str] = set()
        self.upload_failures: dict[str, tuple[int, float]] = {}  # path -> (count, retry at)
        self.ended_at: float | None = None
        self.scan_s = 0.0  # how long the last walk of the checkpoint directory took
        self.baseline = self._load_baseline()
        self._resume_manifest()

    # baseline: what was there before the run (synced, or put back by orch)
    def _load_baseline(self) -> dict[str, list[int]]:
        path = os.path.join(self.state_dir, BASELINE)
        try:
            with open(path) as handle:
                return {k: list(v) for k, v in json.load(handle).items()}
        except (OSError, ValueError):
            pass
        restored = self.config.get("restored") or {}
        baseline: dict[str, list[int]] = {}
        for rel, info in scan(self.root, self.exclude).items():
            known = restored.get(rel)
            if known is not None and int(known.get("size", -1)) == info.st_size:
                self.files[rel] = {
                    "size": info.st_size,
                    "mtime_ns": info.st_mtime_ns,
                    "staged": {
                        "digest": known["digest"], "size": info.st_size,
                        "mtime_ns": info.st_mtime_ns, "object": None, "linked": False,
                        "stored": known.get("key"), "restored": True,
                    },
                }  # fmt: skip
            else:
                baseline[rel] = version_of(info)
        _write_json(path, baseline)
        return baseline

    def _resume_manifest(self) -> None:
        """An agent started again (the node rebooted, a controller re-armed it) keeps what the
        last one staged, where its objects are still there."""
        try:
            with open(os.path.join(self.state_dir, MANIFEST)) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            return
        self.generation = int(manifest.get("generation", 0))
        for rel, entry in (manifest.get("files") or {}).items():
            staged = entry.get("staged")
            kept = staged.get("object") if staged else None
            if kept and not os.path.exists(os.path.join(self.objects, kept)):
                entry["staged"] = None
            self.files.setdefault(rel, entry)
        self.dcp = manifest.get("dcp") or {}

    def run_ended(self) -> bool:
        if os.path.exists(os.path.join(self.run_dir, "exit_code")):
            return True
        try:
            with open(os.path.join(self.run_dir, "pid")) as handle:
                pid = int(handle.read().strip())
        except (OSError, ValueError):
            return time.time() - self.started > NO_RUN_EXIT_S
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return True

    def loop(self) -> None:
        while True:
            if not os.path.isdir(self.state_dir):
                return  # the job's directory was removed: nothing left to do
            ended = self.run_ended()
            if ended and self.ended_at is None:
                self.ended_at = time.time()
            settled = self.pass_once(ended=ended)
            if ended and settled and self._uploads_settled():
                self.write_manifest(done=True)
                return
            if self.dirty:
                self.write_manifest(done=False)
            # Looking costs: a huge directory is looked at less often (at most a tenth of
            # the time spent walking it). Staging is not counted: it is what the looks are for.
            time.sleep(max(self.interval_s, 10 * self.scan_s))

    def pass_once(self, *, ended: bool) -> bool:
        """One look at the checkpoint directory; True when nothing is left to stage."""
        began = time.monotonic()
        refused: dict[str, str] = {}
        found = scan(self.root, self.exclude, refused)
        self._note_refused(refused)
        now_ns, now = time.time_ns(), time.monotonic()
        self.scan_s = now - began
        settled = True
        with self.lock:
            for rel in [r for r in self.files if r not in found]:
                self._forget(rel)
            for rel in [r for r in self._first_seen if r not in found]:
                del self._first_seen[rel]
            marked = {
                rel.rsplit("/", 1)[0] if "/" in rel else ""
                for rel in found
                if rel.rsplit("/", 1)[-1] in (COMPLETE_MARKER, DCP_METADATA)
            }
        for rel, info in sorted(found.items(), key=lambda kv: kv[0].endswith(DCP_METADATA)):
            version = version_of(info)
            with self.lock:
                if self.baseline.get(rel) == version and rel not in self.files:
                    continue
                entry = self.files.setdefault(rel, {"size": None, "mtime_ns": None,
                                                    "staged": None})  # fmt: skip
                if [entry["size"], entry["mtime_ns"]] != version:
                    entry["size"], entry["mtime_ns"] = version
                    entry.pop("rejected", None)
                    self.dirty = True
                self._check_link(rel, entry)
                staged = entry["staged"]
                if staged is not None and [staged["size"], staged["mtime_ns"]] == version:
                    continue
                if entry.get("rejected") == version:
                    continue  # stable, but not whole: it will not get better by waiting
            if not ended and not self._quiet(rel, info, now, now_ns):
                settled = False
                continue
            self._stage(rel, entry, link=written_once(rel, marked))
            with self.lock:
                staged = entry["staged"]
                if staged is None or [staged["size"], staged["mtime_ns"]] != version:
                    settled = False
        self._queue_uploads()
        return settled

    def _note_refused(self, refused: dict[str, str]) -> None:
        """Files left alone for their names are a problem the controller shows."""
        text = None
        if refused:
            first = sorted(refused)[:3]
            named = ", ".join(f"{shown(rel, 80)} ({refused[rel]})" for rel in first)
            more = f" and {len(refused) - len(first)} more" if len(refused) > len(first) else ""
            text = f"not taken as checkpoints: {named}{more}"
        with self.lock:
            if self.problems.get("names") != text:
                if text is None:
                    self.problems.pop("names", None)
                else:
                    self.problems["names"] = text
                self.dirty = True

    def _quiet(self, rel: str, info: os.stat_result, now: float, now_ns: int) -> bool:
        """Whether the file looked the same for `quiet_s`, by this agent's own looks."""
        looks = _identity(info)
        first = self._first_seen.get(rel)
        if first is None or first[0] != looks:
            self._first_seen[rel] = (looks, now)
            return False
        return now - first[1] >= self.quiet_s and now_ns - info.st_mtime_ns >= self.quiet_s * 1e9

    def _check_link(self, rel: str, entry: dict) -> None:
        """A linked copy shares its inode with the file: a rewrite in place changed it too."""
        staged = entry["staged"]
        if not staged or not staged.get("linked"):
            return
        try:
            info = os.lstat(os.path.join(self.objects, staged["object"]))
            looks = [info.st_size, info.st_mtime_ns, info.st_ctime_ns]
            intact = looks == [staged["size"], staged["mtime_ns"], staged.get("ctime_ns")]
        except OSError:
            intact = False
        if not intact:
            self._drop_object(staged["object"])
            entry["staged"] = None
            self.dirty = True

    def _stage(self, rel: str, entry: dict, *, link: bool) -> None:
        result = stage(os.path.join(self.root, *rel.split("/")), rel, self.objects, link=link,
                       tag=f"{os.getpid()}")  # fmt: skip
        with self.lock:
            if isinstance(result, str):
                if result.startswith("not whole"):
                    entry["rejected"] = [entry["size"], entry["mtime_ns"]]
                    self.problems[f"whole:{rel}"] = f"{rel}: {result}"
                elif result.startswith("staging failed"):
                    self.problems["staging"] = f"{rel}: {result}"
                self.dirty = True
                return
            self.problems.pop("staging", None)
            self.problems.pop(f"whole:{rel}", None)
            previous = entry["staged"]
            if previous is not None and previous.get("object"):
                if previous["object"] == result["object"]:
                    previous = None  # the same content again: the object was replaced in place
                else:
                    self.older.setdefault(rel, []).append(previous["object"])
            for old in self.older.get(rel, [])[:-1]:  # keep one previous copy
                self._drop_object(old)
            self.older[rel] = self.older.get(rel, [])[-1:]
            entry["staged"] = result
            self.dirty = True
            if rel.rsplit("/", 1)[-1] == DCP_METADATA:
                self._read_dcp(rel, result)

    def _read_dcp(self, rel: str, staged: dict) -> None:
        directory = rel.rsplit("/", 1)[0] if "/" in rel else ""
        try:
            with open(os.path.join(self.objects, staged["object"]), "rb") as handle:
                files = dcp_files(handle.read())
        except OSError:
            files = None
        self.dcp[directory] = {"metadata_digest": staged["digest"], "files": files}

    def _forget(self, rel: str) -> None:
        entry = self.files.pop(rel)
        staged = entry.get("staged")
        if staged and staged.get("object"):
            self._drop_object(staged["object"])
        for old in self.older.pop(rel, []):
            self._drop_object(old)
        if rel.rsplit("/", 1)[-1] == DCP_METADATA:
            self.dcp.pop(rel.rsplit("/", 1)[0] if "/" in rel else "", None)
        self.dirty = True

    def _drop_object(self, name: str | None) -> None:
        if name:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.objects, name))

    # uploads
    def _queue_uploads(self) -> None:
        if not self.store_settings:
            return
        if self.store is None:
            try:
                self.store = open_store(self.store_settings)
            except StoreError as exc:
                with self.lock:
                    if self.problems.get("store") != str(exc):
                        self.problems["store"] = str(exc)
                        self.dirty = True
                return
        now = time.time()
        with self.lock:
            for rel, entry in self.files.items():
                staged = entry["staged"]
                if not staged or not staged["object"] or staged["stored"] or rel in self.uploading:
                    continue
                failures, retry_at = self.upload_failures.get(rel, (0, 0.0))
                if now < retry_at:
                    continue
                self.uploading.add(rel)
                self.uploads.submit(self._upload, rel, dict(staged))

    def _upload(self, rel: str, staged: dict) -> None:
        _scheme, _where, prefix = parse_store(self.store_settings["url"])
        key = store_key(prefix, self.config["job_id"], rel, staged["digest"])
        path = os.path.join(self.objects, staged["object"])
        error = None
        try:
            before = os.lstat(path)
            assert self.store is not None
            self.store.upload(path, key)
            after = os.lstat(path)
            if [after.st_size, after.st_mtime_ns] != [before.st_size, before.st_mtime_ns]:
                error = f"{rel} changed while it was uploaded"
        except (OSError, StoreError) as exc:
            error = str(exc)
        with self.lock:
            self.uploading.discard(rel)
            entry = self.files.get(rel)
            current = entry["staged"] if entry else None
            if error is None:
                self.upload_failures.pop(rel, None)
                if current is not None and current["digest"] == staged["digest"]:
                    current["stored"] = key
                if self.problems.pop("store", None) is not None or current is not None:
                    self.dirty = True
                return
            count, _ = self.upload_failures.get(rel, (0, 0.0))
            wait = UPLOAD_RETRY_S[min(count, len(UPLOAD_RETRY_S) - 1)]
            self.upload_failures[rel] = (count + 1, time.time() + wait)
            self.problems["store"] = f"upload failed ({count + 1} in a row): {error}"
            self.dirty = True

    def _uploads_settled(self) -> bool:
        if not self.store_settings:
            return True
        with self.lock:
            if self.uploading:
                return False
            # A file put back from the controller's mirror has no staged object (it was never
            # in the store, and the node holds no copy of its own to send): nothing to wait for.
            waiting = [
                r
                for r, e in self.files.items()
                if e["staged"] and e["staged"]["object"] and not e["staged"]["stored"]
            ]
        if not waiting:
            return True
        return self.ended_at is not None and time.time() - self.ended_at > GIVE_UP_UPLOADS_S

    def write_manifest(self, *, done: bool) -> None:
        with self.lock:
            self.generation += 1
            document = {
                "version": MANIFEST_VERSION,
                "generation": self.generation,
                "written_at_ns": time.time_ns(),
                "pid": os.getpid(),
                "done": done,
                "run_ended": self.ended_at is not None,
                "files": self.files,
                "dcp": self.dcp,
                "problems": sorted(self.problems.values()),
            }
            _write_json(os.path.join(self.state_dir, MANIFEST), document)
            self.dirty = False
        with open(os.path.join(self.state_dir, EVENTS), "a") as events:
            events.write(f"{self.generation}\n")


# --- restore: files back from the store ------------------------------------------------------


def canonical(rel: str) -> bool:
    """A relative path with no empty, `.` or `..` part (so not absolute either)."""
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _safe_destination(root: str, rel: str) -> str:
    """`root/rel`, its directories made; refuses a path through a symlink."""
    if not canonical(rel):
        raise StoreError(f"refusing to restore {rel!r}")
    path = root
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise StoreError(f"refusing to restore {rel!r}: {path} is a symlink")
        os.makedirs(path, exist_ok=True)
    return os.path.join(path, rel.split("/")[-1])


def held_already(root: str, item: dict) -> bool:
    """Whether the checkpoint directory holds `item` as recorded (size, then digest): a node
    that stayed through a recovery keeps its files, which need no download."""
    path = root
    try:
        for part in item["path"].split("/"):
            path = os.path.join(path, part)
            if os.path.islink(path):
                return False  # the download refuses such a path; so does this
        if os.path.getsize(path) != int(item["size"]):
            return False
        return file_digest(path) == item["digest"]
    except OSError:
        return False


def restore(plan: dict, out: io.TextIOBase) -> int:
    """Download `plan["files"]` from the store into the checkpoint directory; 0 when every one
    arrived with its digest. A file the directory already holds with the recorded size and
    digest stays as it is. Prints `progress DONE TOTAL` lines and `restored N BYTES S`."""
    root = _home_path(plan["checkpoint_dir"])
    files = plan["files"]
    total = sum(int(f["size"]) for f in files)
    started = time.monotonic()
    try:
        store = open_store(plan["store"])
    except StoreError as exc:
        print(f"error {exc}", file=out, flush=True)
        return 1
    staging = os.path.join(root, ".tmp-orch-restore")
    os.makedirs(staging, exist_ok=True)
    done = [0]
    lock = threading.Lock()

    def fetch(index: int, item: dict) -> None:
        if not canonical(item["path"]) or not held_already(root, item):
            download(index, item)
        with lock:
            done[0] += int(item["size"])
            print(f"progress {done[0]} {total}", file=out, flush=True)

    def download(index: int, item: dict) -> None:
        tmp = os.path.join(staging, str(index))
        if store.download(item["key"], tmp) != item["digest"]:
            raise StoreError(f"{item['key']}: its digest is not the one recorded")
        os.replace(tmp, _safe_destination(root, item["path"]))

    try:
        with ThreadPoolExecutor(max_workers=RESTORE_WORKERS) as pool:
            for future in [pool.submit(fetch, i, f) for i, f in enumerate(files)]:
                future.result()
    except (OSError, StoreError) as exc:
        print(f"error {exc}", file=out, flush=True)
        return 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"restored {len(files)} {total} {time.monotonic() - started:.2f}", file=out, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checkpoint_agent")
    commands = parser.add_subparsers(dest="command", required=True)
    watch = commands.add_parser("watch")
    watch.add_argument("--config", required=True)
    commands.add_parser("restore")
    args = parser.parse_args(argv)
    if args.command == "restore":
        return restore(json.load(sys.stdin), sys.stdout)
    with open(args.config) as handle:
        config = json.load(handle)
    with contextlib.suppress(OSError):
        os.nice(10)  # training comes first
    Agent(config).loop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
