"""Where staged checkpoint copies are uploaded and restored from: `checkpoint.store`.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer; boto3 only for an `s3://` store, imported when one
is opened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

if __package__:
    from orchestrator.node.checkpoint_files import file_digest
else:  # the program on a node: its modules are beside it
    from checkpoint_files import file_digest


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
