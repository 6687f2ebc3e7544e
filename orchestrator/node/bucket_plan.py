"""The pure part of `bucket-data` (`orchestrator.node.bucket_data`): bucket URLs, which object
keys may become local paths, the cache manifest's shape, and what a fetch must do.

Part of the node runtime (`orchestrator.node.runtime`): standard library only, Python 3.8 or
newer. Nothing here does I/O but `local_state`'s callers; keys and the manifest are untrusted
(the bucket's content, and a file job code may rewrite), so every relative path is checked
before it names anything on the node.

The manifest (`manifest_name`), beside the destination:

    {"url": "s3://b/p", "complete": bool,
     "files": {REL: {"etag": E, "size": N, "local_size": N, "mtime_ns": T}}}

REL is the path below the destination for a prefix, `""` for a single object (the destination
is that file). `complete` is true only once a whole fetch succeeded.
"""

from __future__ import annotations

MAX_KEY_BYTES = 1024
SINGLE = ""  # the relative path of a single-object source: the destination itself


class Refused(Exception):
    """A key, URL or path that must not name anything on the node; `kind` as the program
    reports it."""

    def __init__(self, message: str, kind: str = "key") -> None:
        super().__init__(message)
        self.kind = kind


def bounded(text: str, limit: int = 120) -> str:
    """`text` shown safely in a message: repr, at most about `limit` characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + "...'"


def parse_url(url: object) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket[/prefix]`; the prefix without a leading or trailing
    `/` (empty for the whole bucket)."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise Refused(f"not an s3:// URL: {bounded(str(url))}", "other")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket or "/" in bucket or _has_control(bucket):
        raise Refused(f"no bucket name in {bounded(url)}", "other")
    return bucket, prefix.strip("/")


def normal_url(bucket: str, prefix: str) -> str:
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def check_relative(rel: object) -> str:
    """`rel` if it may name a file below a destination: not empty, not absolute, no `.`, `..`
    or empty segment, no control character, at most `MAX_KEY_BYTES` bytes in UTF-8."""
    if not isinstance(rel, str) or not rel:
        raise Refused(f"an object key with an empty relative path: {bounded(str(rel))}")
    try:
        size = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        raise Refused(f"an object key that is not UTF-8: {bounded(rel)}") from None
    if size > MAX_KEY_BYTES:
        raise Refused(f"an object key longer than {MAX_KEY_BYTES} bytes: {bounded(rel)}")
    if _has_control(rel):
        raise Refused(f"an object key with a control character: {bounded(rel)}")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
        raise Refused(f"an object key that is no plain relative path: {bounded(rel)}")
    return rel


def relative_key(key: str, prefix: str) -> str | None:
    """The path below the destination of `key` listed under `prefix/`, checked; None for a
    folder marker (a key ending in `/` with no bytes: consoles make them, and they are no
    file)."""
    start = f"{prefix}/" if prefix else ""
    if not key.startswith(start):
        raise Refused(f"the bucket listed a key outside the prefix: {bounded(key)}")
    return check_relative(key[len(start) :])


def check_tree(rels: list[str]) -> None:
    """Refuse a listing where one path is a file and also a folder of another (`a` and `a/b`):
    both cannot be on a disk."""
    names = set(rels)
    for rel in rels:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in names:
                raise Refused(
                    f"the keys {bounded(folder)} and {bounded(rel)} make {bounded(folder)} both "
                    "a file and a folder"
                )


def manifest_name(dst_name: str) -> str:
    """The manifest's file name, in the directory holding the destination `dst_name`."""
    return f".{dst_name}.orch-data.json"


def read_manifest(document: dict | None, single: bool) -> dict:
    """The manifest in `document` (what `node_kit.read_json` gave), with only well-formed
    entries whose paths pass `check_relative` (or `SINGLE` for a single object): job code
    can write this file, and its paths are used to remove files."""
    manifest = {"url": None, "complete": False, "files": {}}
    if not document:
        return manifest
    if isinstance(document.get("url"), str):
        manifest["url"] = document["url"]
    manifest["complete"] = document.get("complete") is True
    files = document.get("files")
    for rel, entry in files.items() if isinstance(files, dict) else ():
        if single != (rel == SINGLE) or not _well_formed(entry):
            continue
        try:
            if rel != SINGLE:
                check_relative(rel)
        except Refused:
            continue
        manifest["files"][rel] = {k: entry[k] for k in ("etag", "size", "local_size", "mtime_ns")}
    return manifest


def _well_formed(entry: object) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("etag"), str):
        return False
    return all(
        isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) and entry[k] >= 0
        for k in ("size", "local_size", "mtime_ns")
    )


def unchanged(entry: dict, local: tuple[int, int] | None) -> bool:
    """Whether the local file (its (size, mtime_ns), None when it is no regular file) is still
    what the fetch wrote."""
    return local is not None and local == (entry["local_size"], entry["mtime_ns"])


def plan(
    listing: dict[str, tuple[str, int]], manifest: dict, url: str, local: dict
) -> tuple[list[str], list[str], list[str]]:
    """(fetch, keep, remove): relative paths, sorted. `listing` maps each path to the bucket's
    (ETag, size); `local` maps each manifest path to its file's (size, mtime_ns) or None.
    Kept: the manifest is of this `url` and holds the same ETag and size, and the file is
    unchanged. Removed: what the manifest lists and the bucket no longer has. A file the
    manifest does not list is never in `remove`."""
    files = manifest["files"]
    same_url = manifest["url"] == url
    fetch, keep = [], []
    for rel, (etag, size) in sorted(listing.items()):
        entry = files.get(rel)
        if (
            same_url
            and entry is not None
            and (entry["etag"], entry["size"]) == (etag, size)
            and unchanged(entry, local.get(rel))
        ):
            keep.append(rel)
        else:
            fetch.append(rel)
    remove = sorted(rel for rel in files if rel not in listing)
    return fetch, keep, remove


def status(manifest: dict, url: str, local: dict) -> dict:
    """The `status` answer: complete only when the manifest is of `url`, says complete, and
    every file it lists is unchanged."""
    files = manifest["files"]
    complete = (
        manifest["url"] == url
        and manifest["complete"]
        and all(unchanged(entry, local.get(rel)) for rel, entry in files.items())
    )
    return {
        "complete": bool(complete),
        "objects": len(files),
        "bytes": sum(entry["size"] for entry in files.values()),
    }
