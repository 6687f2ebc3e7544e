"""The checkpoint store (`checkpoint.store`) as the controller sees it.

The bytes never pass through the controller: nodes upload staged checkpoints and download
them on resume (`orchestrator.node.checkpoint_agent`). The controller only tells the nodes how
to reach the store (`node_access`), lists what a job left there, and deletes versions that no
rule keeps (`orchestrator.cluster.checkpoints.retention`).

Keys: `<prefix>/<job id>/<path>@<first 16 hex of its digest>`, one per version of a file (the
digest is BLAKE2b-256: `orchestrator.node.checkpoint_agent.new_digest`).
Credentials: on AWS the nodes use the instance profile the provider attaches; nodes with no
credentials of their own (local nodes) get the controller's, in their agent's 0600 config.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config import Settings
from orchestrator.errors import ConfigError, OrchError
from orchestrator.node.checkpoint_agent import parse_store
from orchestrator.node.checkpoint_protocol import StoreAccess


class StoreError(OrchError):
    """The checkpoint store could not be read or changed."""


class StoreClient(Protocol):
    def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix`."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Remove these keys; keys already gone are no error."""
        ...


def job_prefix(url: str, job_id: str) -> str:
    """The key prefix under which a job's checkpoints lie."""
    _scheme, _where, prefix = parse_store(url)
    return "/".join(p for p in (prefix, job_id) if p)


def describe(url: str, key: str) -> str:
    """A key as a URL a user can paste (`s3://bucket/key`, `file:///dir/key`)."""
    scheme, where, _prefix = parse_store(url)
    return f"s3://{where}/{key}" if scheme == "s3" else f"file://{Path(where) / key}"


class FileStoreClient:
    """A `file://` store, where the controller's machine sees the directory too."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        found = []
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                if ".tmp-" not in name:
                    found.append((Path(dirpath) / name).relative_to(self.root).as_posix())
        return sorted(found)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                (self.root / key).unlink()


class S3StoreClient:
    """An `s3://` store through boto3, with the controller's own credentials."""

    def __init__(self, bucket: str, client: Any) -> None:
        self.bucket = bucket
        self.client = client

    def keys(self, prefix: str) -> list[str]:
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix.rstrip("/") + "/"
            )
            for page in pages:
                found.extend(item["Key"] for item in page.get("Contents", []))
        except Exception as exc:  # noqa: BLE001 - botocore's errors have no common base here
            raise StoreError(f"cannot list s3://{self.bucket}/{prefix}: {exc}") from exc
        return found

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        for start in range(0, len(batch), 1000):  # DeleteObjects takes 1000 at a time
            objects = [{"Key": key} for key in batch[start : start + 1000]]
            try:
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except Exception as exc:  # noqa: BLE001
                raise StoreError(f"cannot delete from s3://{self.bucket}: {exc}") from exc


def open_client(url: str, settings: Settings, region: str | None = None) -> StoreClient | None:
    """The controller's client of a store; None for a `file://` store this machine cannot see
    (the nodes' shared mount), which is then never pruned from here."""
    scheme, where, _prefix = parse_store(url)
    if scheme == "file":
        root = Path(where)
        return FileStoreClient(root) if root.is_dir() else None
    import boto3  # here: boto3 takes a third of a second to import

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=settings.store.endpoint_url,
        region_name=settings.store.region or region,
    )
    return S3StoreClient(where, client)


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
