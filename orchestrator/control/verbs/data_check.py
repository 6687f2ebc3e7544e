"""The data a job names, checked at submit before anything is launched, and shown by a dry run.

`check_data` asks S3 about every bucket the spec names (`cluster.bucket_check`) and, for a dry
run, measures each local source (files and bytes, counted up to `MAX_LOCAL_FILES`). A finding
that refuses the submit (a missing bucket or prefix; access denied or no credentials where the
nodes use this machine's) raises one `SpecError` (exit 2) naming every such field; the others
come back as warnings for the CLI to say.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.cluster.bucket_check import MAX_COUNT, BucketFinding, check_buckets
from orchestrator.config import Settings
from orchestrator.control.verbs.stale_files import size_text
from orchestrator.errors import SpecError
from orchestrator.spec.model import JobSpec, LoadedJob

NODES_WITH_OWN_CREDENTIALS = frozenset({"aws"})
"""Providers whose nodes reach S3 with credentials of their own (an instance role); the local
provider's nodes get this machine's."""

MAX_LOCAL_FILES = 100_000
"""The most files a dry run counts in one local source before it says "at least"."""


@dataclass(frozen=True)
class LocalSource:
    """A local `data` source as a dry run measured it."""

    place: str  # data[0].src
    path: str  # the absolute local path
    files: int  # regular files (a file source: 1); symlinks are not counted
    bytes: int
    at_least: bool = False  # the count stopped at MAX_LOCAL_FILES


@dataclass(frozen=True)
class DataCheck:
    """What a submit found of the job's data: local sources (measured by a dry run only) and
    every bucket's finding."""

    local: tuple[LocalSource, ...]
    buckets: tuple[BucketFinding, ...]
    nodes_have_credentials: bool

    def _said(self, severity: str) -> list[str]:
        ours = self.nodes_have_credentials
        return [f.message(ours) for f in self.buckets if f.severity(ours) == severity]

    def errors(self) -> list[str]:
        """The findings that refuse the submit, one line each."""
        return self._said("error")

    def warnings(self) -> list[str]:
        """The findings said before the submit goes on, one line each."""
        return self._said("warning")

    def lines(self, spec: JobSpec) -> list[str]:
        """A dry run's lines: each data source and output, with what was found of it."""
        local = {s.place: s for s in self.local}
        found = {f.place: f for f in self.buckets}
        shown = []
        for i, mount in enumerate(spec.data):
            place = f"data[{i}].src"
            what = _local_text(local[place]) if place in local else _bucket_text(found.get(place))
            shown.append(f"data[{i}] {mount.src} -> {mount.dst}: {what}")
        for i, output in enumerate(spec.outputs):
            who = "every node, under node-<rank>/" if output.nodes == "all" else "node 0"
            what = _bucket_text(found.get(f"outputs[{i}].dst"))
            shown.append(f"outputs[{i}] {output.src} -> {output.dst} ({who}): {what}")
        return shown

    def as_dict(self) -> dict[str, Any]:
        return {
            "local": [asdict(s) for s in self.local],
            "buckets": [
                {**f.as_dict(), "severity": f.severity(self.nodes_have_credentials)}
                for f in self.buckets
            ],
            "nodes_have_credentials": self.nodes_have_credentials,
        }


def _local_text(source: LocalSource) -> str:
    more = "at least " if source.at_least else ""
    return f"{more}{source.files} file(s), {more}{size_text(source.bytes)}"


def _bucket_text(finding: BucketFinding | None) -> str:
    if finding is None or finding.outcome != "found":
        return "not checked" if finding is None else f"{finding.outcome} (see below)"
    if finding.found == "bucket":
        return "the bucket exists"
    if finding.objects is None or finding.bytes is None:
        return "found"
    if finding.found == "object":
        return f"one object, {size_text(finding.bytes)}"
    more = "at least " if finding.at_least else ""
    return f"{more}{finding.objects} object(s), {more}{size_text(finding.bytes)}"


def check_data(
    loaded: LoadedJob, settings: Settings, *, measure: bool = False, max_count: int = MAX_COUNT
) -> DataCheck:
    """Check the job's buckets from this machine (and, with `measure`, the dry run's, count
    each local source and each bucket prefix). Raises `SpecError` naming every field whose
    finding refuses the submit; nothing is launched before it."""
    spec = loaded.spec
    ours = spec.provider in NODES_WITH_OWN_CREDENTIALS
    found = check_buckets(spec, settings, count=measure, max_count=max_count)
    local = []
    for i, source in enumerate(loaded.data_sources):
        if measure and source is not None:
            local.append(measure_local(f"data[{i}].src", source))
    checked = DataCheck(tuple(local), tuple(found), ours)
    errors = checked.errors()
    if errors:
        raise SpecError(
            "the job's buckets are not ready:\n" + "\n".join(f"  {line}" for line in errors),
            hint="fix the bucket or the spec and submit again; nothing was launched",
        )
    return checked


def measure_local(place: str, path: Path, max_files: int = MAX_LOCAL_FILES) -> LocalSource:
    """The regular files under `path` (or `path` itself) and their bytes, up to `max_files`;
    symlinks are neither followed nor counted."""
    if not path.is_dir():
        size = path.lstat().st_size if path.is_file() else 0
        return LocalSource(place, str(path), 1 if path.is_file() else 0, size)
    files = size = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            if files >= max_files:
                return LocalSource(place, str(path), files, size, at_least=True)
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:  # gone since the listing
                continue
            if stat.S_ISREG(info.st_mode):
                files += 1
                size += info.st_size
    return LocalSource(place, str(path), files, size)
