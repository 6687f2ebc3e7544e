"""The checkpoint store (`checkpoint.store`) as the controller sees it.

The bytes never pass through the controller: nodes upload staged checkpoints and download
them on resume (`orchestrator.node.checkpoint_agent`). The controller only tells the nodes how
to reach the store (`node_access`), lists what a job left there, and deletes versions that no
rule keeps (`orchestrator.cluster.checkpoints.retention`).

Keys: `<prefix>/<job id>/<path>@<first 16 hex of its digest>`, one per version of a file (the
digest is BLAKE2b-256: `orchestrator.node.checkpoint_files.new_digest`). The controller computes
them (`StoreKeys`); a client is bound to one job's prefix and refuses to delete any key outside
it or not canonical, and a `file://` client follows no symlink below the store's directory.
Credentials: on AWS the nodes use the instance profile the provider attaches; nodes with no
credentials of their own (local nodes) get the controller's, in their agent's 0600 config.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config import Settings
from orchestrator.errors import ConfigError, OrchError
from orchestrator.node.checkpoint_protocol import StoreAccess, StoreKeys
from orchestrator.node.checkpoint_stores import parse_store


class StoreError(OrchError):
    """The checkpoint store could not be read or changed."""


class StoreClient(Protocol):
    """The store of one job (`scope`): listing and deleting its keys, and no others."""

    scope: StoreKeys

    def keys(self) -> list[str]:
        """Every key under the job's prefix."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Remove these keys; keys already gone are no error. Raises StoreError, deleting
        nothing, when any key is not the job's (`StoreKeys.owns`)."""
        ...


def job_prefix(url: str, job_id: str) -> str:
    """The key prefix under which a job's checkpoints lie."""
    return StoreKeys.of(url, job_id).base


def _refuse_foreign(scope: StoreKeys, keys: list[str]) -> None:
    foreign = [key for key in keys if not scope.owns(key)]
    if foreign:
        shown = ", ".join(repr(k)[:120] for k in foreign[:3])
        raise StoreError(
            f"refusing to delete {len(foreign)} key(s) outside {scope.base}/ or not canonical: "
            f"{shown}",
            hint="nothing was deleted; orch deletes only keys it computed for the job",
        )


def describe(url: str, key: str) -> str:
    """A key as a URL a user can paste (`s3://bucket/key`, `file:///dir/key`)."""
    scheme, where, _prefix = parse_store(url)
    return f"s3://{where}/{key}" if scheme == "s3" else f"file://{Path(where) / key}"


_BELOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class FileStoreClient:
    """A `file://` store, where the controller's machine sees the directory too. Nodes may
    write that directory (a shared mount), so below `root` no symlink is followed: the job's
    folder, or one inside it, swapped for a link to elsewhere is refused, never walked."""

    def __init__(self, root: Path, scope: StoreKeys) -> None:
        self.root = root
        self.scope = scope

    def _open_below(self, parts: list[str]) -> int | None:
        """A descriptor of `root/parts...`, reached without following a symlink; None when a
        part does not exist. Raises StoreError for a symlink or a file on the way."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise StoreError(f"cannot open the store {self.root}: {exc.strerror}") from exc
        try:
            for i, part in enumerate(parts):
                try:
                    below = os.open(part, _BELOW, dir_fd=fd)
                except FileNotFoundError:
                    os.close(fd)
                    return None
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    where = self.root.joinpath(*parts[: i + 1])
                    raise StoreError(
                        f"{where} is a symlink or not a folder; orch does not follow it",
                        hint="a node (or anyone who can write the store) put it there: look "
                        "at it, and remove it from the store",
                    ) from exc
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    def keys(self) -> list[str]:
        fd = self._open_below(self.scope.base.split("/"))
        if fd is None:
            return []
        found: list[str] = []
        try:
            for dirpath, _dirs, names, _fd in os.fwalk(dir_fd=fd):  # symlinks: not followed
                rel = os.path.normpath(dirpath)
                for name in names:
                    if ".tmp-" not in name:
                        key = "/".join(p for p in (self.scope.base, rel, name) if p != ".")
                        found.append(key)
        finally:
            os.close(fd)
        return sorted(found)

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        _refuse_foreign(self.scope, batch)
        for key in batch:
            parts = key.split("/")
            fd = self._open_below(parts[:-1])
            if fd is None:
                continue
            try:
                os.unlink(parts[-1], dir_fd=fd)  # unlink never follows its last part
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot delete {self.root / key}: {exc.strerror}") from exc
            finally:
                os.close(fd)


class S3StoreClient:
    """An `s3://` store through boto3, with the controller's own credentials."""

    def __init__(self, bucket: str, client: Any, scope: StoreKeys) -> None:
        self.bucket = bucket
        self.client = client
        self.scope = scope

    def keys(self) -> list[str]:
        found: list[str] = []
        prefix = self.scope.base
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix + "/"
            )
            for page in pages:
                found.extend(item["Key"] for item in page.get("Contents", []))
        except Exception as exc:  # noqa: BLE001 - botocore's errors have no common base here
            raise StoreError(f"cannot list s3://{self.bucket}/{prefix}: {exc}") from exc
        return found

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        _refuse_foreign(self.scope, batch)
        for start in range(0, len(batch), 1000):  # DeleteObjects takes 1000 at a time
            objects = [{"Key": key} for key in batch[start : start + 1000]]
            try:
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except Exception as exc:  # noqa: BLE001
                raise StoreError(f"cannot delete from s3://{self.bucket}: {exc}") from exc


def open_client(
    url: str, settings: Settings, job_id: str, region: str | None = None
) -> StoreClient | None:
    """The controller's client of one job's part of a store; None for a `file://` store this
    machine cannot see (the nodes' shared mount), which is then never pruned from here."""
    scheme, where, _prefix = parse_store(url)
    scope = StoreKeys.of(url, job_id)
    if scheme == "file":
        root = Path(where)
        return FileStoreClient(root, scope) if root.is_dir() else None
    import boto3  # here: boto3 takes a third of a second to import

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=settings.store.endpoint_url,
        region_name=settings.store.region or region,
    )
    return S3StoreClient(where, client, scope)


def node_access(
    url: str, settings: Settings, *, nodes_have_credentials: bool, region: str | None = None
) -> StoreAccess:
    """How the nodes reach the store. Nodes without credentials of their own get the
    controller's (from boto3's usual chain), resolved now, for their agent's config."""
    scheme, _where, _prefix = parse_store(url)
    if scheme == "file":
        return StoreAccess(url)
    credentials = None
    if not nodes_have_credentials:
        import boto3

        found = boto3.session.Session().get_credentials()
        if found is None:
            raise ConfigError(
                f"checkpoint.store is {url}, and neither these nodes nor this machine have AWS "
                "credentials to reach it",
                hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or a profile) for orch",
            )
        frozen = found.get_frozen_credentials()
        credentials = {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key}
        if frozen.token:
            credentials["session_token"] = frozen.token
    return StoreAccess(
        url,
        endpoint_url=settings.store.node_endpoint_url or settings.store.endpoint_url,
        region=settings.store.region or region,
        credentials=credentials,
    )
