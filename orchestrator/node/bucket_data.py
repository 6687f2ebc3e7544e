"""Data between a bucket and a node: the node runtime's `bucket-data` program.

    python3 -u orch-node-<v>.pyz bucket-data fetch|upload|status < request.json

The request is one JSON object on stdin; the answer is JSON lines on stdout, one per event
(`node_kit.dumps`). Standard library only, Python 3.8 or newer; boto3 (with the s3transfer it
brings) is imported by `fetch` and `upload` only. Without it: kind `boto3`.

fetch  {"url": "s3://b/p", "dst": "/abs/path", "endpoint_url", "region", "credentials",
        "concurrency": 16}
    -> {"listing": {"objects", "bytes"}}, {"plan": {"fetch", "fetch_bytes", "keep", "remove"}},
       {"progress": {"bytes", "total", "objects", "of"}} (at most once a second),
       {"done": {"objects", "fetched", "bytes", "kept", "removed", "seconds"}}   exit 0
    or {"error": MESSAGE, "kind": "missing"|"denied"|"disk"|"boto3"|"key"|"other"}   exit 1
upload {"src": "/abs/dir-or-file", "url": "s3://b/p", ...}
    -> progress lines, {"done": {"files", "bytes", "skipped", "seconds"[, "missing": true]}}
status {"dst": "/abs/path", "url": "s3://b/p"} -> {"status": {"complete", "objects", "bytes"}}

A URL naming one object (HeadObject finds it, and it does not end in `/`) is fetched to the
file `dst`; otherwise every object under `prefix/` goes to `dst/<its path below the prefix>`.
What the fetch wrote is recorded in a manifest beside `dst` (`bucket_plan.manifest_name`): an
object whose ETag and size match it, and whose file still has the size and mtime it had when
written, is kept; the others are downloaded to a new file in the same folder and renamed when
whole, and the manifest is rewritten as they finish (at most once a second), so an interrupted
fetch resumes with what is whole and never takes a part for the whole. Only the last write of
a successful fetch says `complete`. What a killed fetch left of a download (`.NAME.orch-part-`
and 12 hex digits) is removed when NAME is downloaded again. Files the manifest lists that the
bucket no longer has are removed; files it does not list are never touched.

Keys and the manifest are untrusted (`bucket_plan`). Every file is reached from the
destination through real folders, each opened with O_NOFOLLOW: a folder that job code
replaced by a symlink stops the fetch (kind `key`); nothing is written, read for upload or
removed through a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time

if __package__:
    import orchestrator.node.bucket_plan as bp
    from orchestrator.node.bucket_transfer import PART_MARK, open_client, part_stem
    from orchestrator.node.node_kit import dumps, read_json, write_at
else:  # the program on a node: its modules are beside it
    import bucket_plan as bp
    from bucket_transfer import PART_MARK, open_client, part_stem
    from node_kit import dumps, read_json, write_at

MODULES = ("bucket_plan.py", "bucket_transfer.py", "node_kit.py")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def node_path(value: object) -> object:
    """A path of the request as this node reads it: a relative one (`ds`, the way the
    controller names `~/ds`) lies under the login user's home; anything else as it came."""
    if isinstance(value, str) and value and not os.path.isabs(value):
        return os.path.join(os.path.expanduser("~"), value)
    return value


def emit(document: dict) -> None:
    sys.stdout.write(dumps(document) + "\n")
    sys.stdout.flush()


class Folders:
    """Folders below a root descriptor, each opened once, through real folders only."""

    def __init__(self, root_fd: int) -> None:
        self.fds = {"": root_fd}
        self.lock = threading.Lock()

    def get(self, folder: str, create: bool) -> int | None:
        """The descriptor of `folder` (relative, `/`-separated); None when it is not there and
        not `create`. A symlink or a file on the way: `Refused` (kind `key`)."""
        with self.lock:
            if folder in self.fds:
                return self.fds[folder]
            parent, _, name = folder.rpartition("/")
        parent_fd = self.get(parent, create)
        if parent_fd is None:
            return None
        fd = open_folder(parent_fd, name, create, shown=folder)
        with self.lock:
            if fd is not None and folder in self.fds:  # another thread opened it meanwhile
                os.close(fd)
                return self.fds[folder]
            if fd is not None:
                self.fds[folder] = fd
        return fd

    def place(self, rel: str, create: bool = False) -> tuple[int | None, str]:
        folder, _, name = rel.rpartition("/")
        return self.get(folder, create), name

    def close(self) -> None:
        for folder, fd in self.fds.items():
            if folder:
                os.close(fd)


def open_folder(parent_fd: int, name: str, create: bool, shown: str) -> int | None:
    for attempt in (0, 1):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create or attempt:
                return None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise bp.Refused(
                    f"{bp.bounded(shown)} is a symlink or no folder: remove it and fetch again"
                ) from None
            raise
    return None


def local_file(fd: int | None, name: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of the regular file `name` in the folder `fd`; None for anything else."""
    if fd is None:
        return None
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def local_state(folders: Folders, rels: list[str], single_name: str) -> dict:
    state = {}
    for rel in rels:
        if rel == bp.SINGLE:
            state[rel] = local_file(folders.get("", False), single_name)
            continue
        try:
            fd, name = folders.place(rel)
        except bp.Refused:
            fd, name = None, ""
        state[rel] = local_file(fd, name)
    return state


class Destination:
    """Where a fetch writes: the folder holding `dst` (and the manifest) and the root the
    relative paths start from (`dst` itself for a prefix, its folder for one object)."""

    def __init__(self, dst: object, single: bool) -> None:
        dst = node_path(dst)
        if not isinstance(dst, str) or not os.path.isabs(dst) or dst.rstrip("/") == "":
            raise bp.Refused(f"dst must be an absolute path below /, not {bp.bounded(str(dst))}",
                             "other")  # fmt: skip
        self.path = dst = os.path.normpath(dst)
        parent, self.name = os.path.split(dst)
        self.single = single
        os.makedirs(parent, exist_ok=True)
        self.parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        root_fd = self.parent_fd if single else open_folder(self.parent_fd, self.name, True, dst)
        self.folders = Folders(root_fd)  # type: ignore[arg-type]
        self.manifest_name = bp.manifest_name(self.name)
        self.parts: dict[int, list[str]] = {}

    def place(self, rel: str, create: bool = False) -> tuple[int | None, str]:
        if rel == bp.SINGLE:
            return self.parent_fd, self.name
        return self.folders.place(rel, create)

    def clear_parts(self, fd: int, name: str) -> None:
        """Remove what a stopped fetch left of `name`'s download in the folder `fd`
        (`bucket_transfer.new_part`'s names)."""
        if fd not in self.parts:
            self.parts[fd] = [n for n in os.listdir(fd) if PART_MARK in n]
        start = part_stem(name)
        for left in self.parts[fd]:
            if left.startswith(start) and len(left) == len(start) + 12:
                with contextlib.suppress(OSError):
                    os.unlink(left, dir_fd=fd)

    def read_manifest(self) -> dict:
        try:
            fd = os.open(self.manifest_name, _READ_FLAGS, dir_fd=self.parent_fd)
        except OSError:
            return bp.read_manifest(None, self.single)
        with os.fdopen(fd, "rb") as f:
            text = f.read()
        return bp.read_manifest(read_json(text.decode("utf-8", "replace")), self.single)

    def write_manifest(self, manifest: dict) -> None:
        self.write_text(dumps(manifest))

    def write_text(self, text: str) -> None:
        write_at(self.parent_fd, self.manifest_name, text)

    def local(self, rels: list[str]) -> dict:
        return local_state(self.folders, rels, self.name)

    def free_bytes(self) -> int:
        st = os.statvfs(self.parent_fd)
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        self.folders.close()
        if self.folders.fds[""] != self.parent_fd:
            os.close(self.folders.fds[""])
        os.close(self.parent_fd)


def list_source(client: object, url: str, bucket: str, prefix: str) -> tuple[bool, dict, dict]:
    """(single, listing rel -> (ETag, size), keys rel -> key) of the source."""
    from botocore.exceptions import ClientError

    head_denied = None
    if prefix and not url.endswith("/"):
        try:
            head = client.head_object(Bucket=bucket, Key=prefix)  # type: ignore[attr-defined]
            return True, {bp.SINGLE: (head["ETag"], head["ContentLength"])}, {bp.SINGLE: prefix}
        except ClientError as exc:
            if _code(exc) not in ("404", "NoSuchKey", *_DENIED):
                raise
            head_denied = exc if _code(exc) in _DENIED else None
    listing, keys = {}, {}
    pages = client.get_paginator("list_objects_v2").paginate(  # type: ignore[attr-defined]
        Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
    )
    for page in pages:
        for item in page.get("Contents", ()):
            key, size = item["Key"], item["Size"]
            if key.endswith("/") and size == 0:
                continue  # a folder marker
            rel = bp.relative_key(key, prefix)
            listing[rel], keys[rel] = (item["ETag"], size), key
    if not listing and head_denied is not None:  # perhaps one object that may not be read
        raise head_denied
    if not listing:
        raise bp.Refused(
            f"no object under {bp.normal_url(bucket, prefix)}: check data[].src, or upload the "
            "data first", "missing")  # fmt: skip
    bp.check_tree(list(listing))
    return False, listing, keys


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code", ""))


_DENIED = ("AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "ExpiredToken", "InvalidToken")  # fmt: skip


def classify(exc: BaseException, source: str) -> bp.Refused:
    """The error line's message and kind for what boto3 or the disk raised."""
    if isinstance(exc, bp.Refused):
        return exc
    code, name = _code(exc), type(exc).__name__
    if code in ("NoSuchBucket", "NoSuchKey", "404"):
        what = "the bucket" if code == "NoSuchBucket" else "the object"
        return bp.Refused(f"{source}: {what} does not exist: check the URL", "missing")
    if code in _DENIED or name in ("NoCredentialsError", "PartialCredentialsError"):
        return bp.Refused(
            f"{source}: access denied ({code or name}): give the node's role or the "
            "credentials orch hands over read access to the bucket", "denied")  # fmt: skip
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return bp.Refused(f"{source}: the node's disk is full: use a larger disk", "disk")
    return bp.Refused(f"{source}: {name}: {str(exc)[:300]}", "other")


def fetch(request: dict) -> dict:
    started = time.monotonic()
    url_text = request.get("url")
    bucket, prefix = bp.parse_url(url_text)
    url = bp.normal_url(bucket, prefix)
    client, transfers = open_client(request)
    try:
        try:
            single, listing, keys = list_source(client, str(url_text), bucket, prefix)
        except Exception as exc:  # noqa: BLE001 - boto3 raises many kinds
            raise classify(exc, url) from None
        total = sum(size for _, size in listing.values())
        emit({"listing": {"objects": len(listing), "bytes": total}})
        dest = Destination(request.get("dst"), single)
        try:
            return _fetch_into(dest, transfers, url, bucket, listing, keys, started)
        finally:
            dest.close()
    finally:
        transfers.close()


def _fetch_into(dest, transfers, url, bucket, listing, keys, started) -> dict:  # noqa: ANN001
    manifest = dest.read_manifest()
    local = dest.local(list(manifest["files"]))
    to_fetch, keep, remove = bp.plan(listing, manifest, url, local)
    fetch_bytes = sum(listing[rel][1] for rel in to_fetch)
    emit({"plan": {"fetch": len(to_fetch), "fetch_bytes": fetch_bytes, "keep": len(keep),
                   "remove": len(remove)}})  # fmt: skip
    free = dest.free_bytes()
    if fetch_bytes > free:
        raise bp.Refused(
            f"{url}: {fetch_bytes} bytes to download but {free} bytes free on the disk of "
            f"{dest.path}: use a larger disk or less data", "disk")  # fmt: skip
    files = {rel: manifest["files"][rel] for rel in keep}
    if manifest["url"] == url:  # what is still there until replaced, for a resumed fetch
        files.update({rel: manifest["files"][rel] for rel in to_fetch if rel in manifest["files"]})
    state = {"url": url, "complete": False, "files": files}
    for rel in remove:
        _remove(dest, rel)
        state["files"].pop(rel, None)
    dest.write_manifest(state)
    lock = threading.Lock()

    def place(rel: str) -> tuple[int, str]:
        with lock:  # its old record no longer says what is there once the new file replaces it
            state["files"].pop(rel, None)
        fd, name = dest.place(rel, create=True)
        dest.clear_parts(fd, name)  # type: ignore[arg-type]
        return fd, name  # type: ignore[return-value]

    def whole(rel: str, record: dict) -> None:
        with lock:
            state["files"][rel] = record

    def save() -> None:
        with lock:
            text = dumps(state)
        dest.write_text(text)

    items = [(rel, keys[rel], listing[rel]) for rel in to_fetch]
    failure = transfers.download_all(bucket, items, place, whole, emit, save)
    save()
    if failure is not None:
        raise classify(failure, url)
    state["complete"] = True
    save()
    return {"done": {"objects": len(listing), "fetched": len(to_fetch), "bytes": fetch_bytes,
                     "kept": len(keep), "removed": len(remove),
                     "seconds": round(time.monotonic() - started, 3)}}  # fmt: skip


def _remove(dest: Destination, rel: str) -> None:
    try:
        fd, name = dest.place(rel)
    except bp.Refused:
        return  # reached through a symlink now: not ours to follow
    if fd is None:
        return
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass


def upload(request: dict) -> dict:
    started = time.monotonic()
    bucket, prefix = bp.parse_url(request.get("url"))
    src = node_path(request.get("src"))
    if not isinstance(src, str) or not os.path.isabs(src):
        raise bp.Refused(f"src must be an absolute path, not {bp.bounded(str(src))}", "other")
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        return {"done": {"files": 0, "bytes": 0, "skipped": 0, "seconds": 0.0, "missing": True}}
    if stat.S_ISLNK(st.st_mode):
        return {"done": {"files": 0, "bytes": 0, "skipped": 1, "seconds": 0.0}}
    _client, transfers = open_client(request)
    files, skipped = _upload_list(src, st)
    base = f"{prefix}/" if prefix else ""
    items = [(path, base + rel, size) for path, rel, size in files]
    try:
        failure = transfers.upload_all(bucket, items, emit)
    finally:
        transfers.close()
    if failure is not None:
        raise classify(failure, bp.normal_url(bucket, prefix))
    seconds = round(time.monotonic() - started, 3)
    return {"done": {"files": len(items), "bytes": sum(size for _, _, size in items),
                     "skipped": skipped, "seconds": seconds}}  # fmt: skip


def _upload_list(src: str, st: os.stat_result) -> tuple[list, int]:
    """((path, relative path, size) of every regular file under `src`, symlinks and other
    non-files skipped and counted)."""
    if stat.S_ISREG(st.st_mode):
        return [(src, os.path.basename(src), st.st_size)], 0
    files, skipped = [], 0
    for dirpath, dirnames, filenames in os.walk(src):
        kept = []
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                skipped += 1
            else:
                kept.append(d)
        dirnames[:] = sorted(kept)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            try:
                lst = os.lstat(path)
                bp.check_relative(rel)
            except (OSError, bp.Refused):
                skipped += 1
                continue
            if stat.S_ISREG(lst.st_mode):
                files.append((path, rel, lst.st_size))
            else:
                skipped += 1
    return files, skipped


def status(request: dict) -> dict:
    bucket, prefix = bp.parse_url(request.get("url"))
    url = bp.normal_url(bucket, prefix)
    dst = node_path(request.get("dst"))
    empty = {"status": {"complete": False, "objects": 0, "bytes": 0}}
    if not isinstance(dst, str) or not os.path.isabs(dst):
        return empty
    parent, name = os.path.split(os.path.normpath(dst))
    try:
        fd = os.open(os.path.join(parent, bp.manifest_name(name)), _READ_FLAGS)
    except OSError:
        return empty
    with os.fdopen(fd, "rb") as f:
        document = read_json(f.read().decode("utf-8", "replace"))
    single = bool(document) and isinstance(document.get("files"), dict) and (
        bp.SINGLE in document["files"])  # fmt: skip
    try:
        dest = Destination(dst, single) if os.path.lexists(dst) or single else None
    except (bp.Refused, OSError):
        dest = None
    if dest is None:
        return empty
    try:
        manifest = bp.read_manifest(document, single)
        return {"status": bp.status(manifest, url, dest.local(list(manifest["files"])))}
    finally:
        dest.close()


COMMANDS = {"fetch": fetch, "upload": upload, "status": status}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in COMMANDS:
        print("usage: bucket_data.py fetch|upload|status < request.json", file=sys.stderr)
        return 2
    request = read_json(sys.stdin.read())
    if request is None:
        emit({"error": "the request on stdin is no JSON object", "kind": "other"})
        return 1
    try:
        emit(COMMANDS[argv[0]](request))
    except bp.Refused as exc:
        emit({"error": str(exc), "kind": exc.kind})
        return 1
    except OSError as exc:
        refused = classify(exc, str(request.get("url")))
        emit({"error": str(refused), "kind": refused.kind})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
