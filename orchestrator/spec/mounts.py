"""What a job brings to its nodes and takes back from them (pure): `data` entries, local paths
or bucket URLs copied to every node before the run (`DataMount`), and `outputs`, node
directories uploaded to a bucket when the job ends (`OutputMount`).

A bucket URL is `s3://bucket` or `s3://bucket/key-or-prefix`. `bucket_url` checks and
normalizes one: the bucket name as S3 allows it (`BUCKET_RE`), the key free of control
characters and of empty, `.` and `..` segments, at most 1024 bytes, with no trailing `/`. Any
other `scheme://` in a `data[].src` is refused by name rather than taken for a local path.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from orchestrator.spec.values import (
    _check_node_path_text,
    _check_path_text,
    _local_path,
    _node_path,
    _show,
)

BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""An S3 bucket name: 3-63 lowercase letters, digits, '.' and '-'."""

S3 = "s3://"
MAX_KEY_BYTES = 1024  # S3's own limit on a key
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def looks_like_url(text: str) -> bool:
    """Whether `text` starts with a `scheme://` (a bucket or a remote source, not a path)."""
    return _SCHEME_RE.match(text) is not None


def bucket_url(value: str) -> str:
    """`value` as a normalized `s3://bucket[/prefix]` (no trailing `/`; the prefix may be
    empty). Raises ValueError, saying what is wrong and what to write, for anything else."""
    if not value.startswith(S3):
        raise ValueError(f"{_show(value)} is not a bucket URL: write s3://bucket/prefix")
    bucket, _, key = value[len(S3) :].partition("/")
    if not BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(
            f"invalid S3 bucket name {_show(bucket)}: 3-63 lowercase letters, digits, "
            "'.' and '-' (write s3://bucket/prefix)"
        )
    key = key.rstrip("/")
    if _CONTROL_RE.search(key):
        raise ValueError(f"the key {_show(key)} has a control character: remove it")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"the key is longer than S3's limit of {MAX_KEY_BYTES} bytes")
    if key and any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(
            f"invalid key {_show(key)}: no empty, '.' or '..' parts (write s3://bucket/a/b)"
        )
    return S3 + bucket + ("/" + key if key else "")


def split_bucket_url(url: str) -> tuple[str, str]:
    """(bucket, key) of a normalized bucket URL (`bucket_url`); the key may be empty."""
    bucket, _, key = url[len(S3) :].partition("/")
    return bucket, key


def _data_source(value: str) -> str:
    _check_path_text(value)
    if value.startswith(S3):
        return bucket_url(value)
    if looks_like_url(value):
        scheme = value.split("://", 1)[0]
        raise ValueError(
            f"{scheme}:// sources are not supported: give a local path or an s3:// bucket "
            "(copy the data to S3, or to this machine, first)"
        )
    return value


class DataMount(BaseModel):
    """A local file or directory, or a bucket's object or prefix, copied to every node before
    the run."""

    model_config = ConfigDict(extra="forbid")

    src: str = Field(
        description="local path (relative to the spec file's directory; ~ expanded), or "
        "s3://bucket/prefix: an object or every object under the prefix, downloaded by each "
        "node itself"
    )
    dst: str = Field(
        description="path on the node: '~/x' or relative = under the node's home; absolute as "
        "is (a bucket prefix: the directory its objects go to; one object: the file)"
    )

    @field_validator("src")
    @classmethod
    def _src_ok(cls, value: str) -> str:
        return _data_source(value)

    @field_validator("dst")
    @classmethod
    def _dst_ok(cls, value: str) -> str:
        return _check_node_path_text(value)

    @property
    def bucket_url(self) -> str | None:
        """The normalized `s3://bucket/prefix` of a bucket source; None for a local one."""
        return self.src if self.src.startswith(S3) else None

    def source_path(self, base_dir: Path) -> Path:
        """The absolute local path of `src`, given the spec file's directory (a local source
        only: raises ValueError for a bucket)."""
        if self.bucket_url is not None:
            raise ValueError(f"{self.src} is a bucket, not a local path")
        return _local_path(self.src, base_dir)

    def node_path(self, home: PurePosixPath) -> PurePosixPath:
        """The path `dst` names on a node whose home directory is `home`."""
        return _node_path(self.dst, home, home)


class OutputMount(BaseModel):
    """A path on the nodes uploaded to a bucket when the job ends, however it ends."""

    model_config = ConfigDict(extra="forbid")

    src: str = Field(
        description="path on the node: '~/x' or relative = under the node's home; absolute as "
        "is; a directory (every file under it) or one file"
    )
    dst: Annotated[str, AfterValidator(bucket_url)] = Field(
        description="s3://bucket/prefix the files go to, at their path relative to src"
    )
    nodes: Literal["head", "all"] = Field(
        default="head",
        description="head: node 0 uploads; all: every node uploads, node r under <dst>/node-<r>/",
    )

    @field_validator("src")
    @classmethod
    def _src_ok(cls, value: str) -> str:
        return _check_node_path_text(value)

    @property
    def dst_url(self) -> str:
        """The normalized `s3://bucket/prefix` (the field itself, normalized on validation)."""
        return self.dst

    def node_path(self, home: PurePosixPath) -> PurePosixPath:
        """The path `src` names on a node whose home directory is `home`."""
        return _node_path(self.src, home, home)

    def node_url(self, rank: int) -> str | None:
        """Where node `rank` uploads: `dst` (node 0 with `head`), `dst/node-<rank>` (`all`);
        None for a node that uploads nothing."""
        if self.nodes == "all":
            return f"{self.dst}/node-{rank}"
        return self.dst if rank == 0 else None
