"""Which files of a local workdir the sync sends, asked of rsync itself with the sync's own
filters (`sync.WORKDIR_FILTERS`: .gitignore, .orchignore, no .git), so what is listed is what
the nodes get."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from orchestrator.remote.sync import WORKDIR_FILTERS

LIST_TIMEOUT_S = 30.0


def listing_argv(workdir: Path, patterns: Sequence[str]) -> list[str]:
    """rsync argv that lists (sends nothing) the files of `workdir` the sync sends whose names
    match one of `patterns` (rsync patterns, e.g. "*.py"), symlinks included."""
    keep = [f"--include={pattern}" for pattern in patterns]
    return [
        "rsync", "-rl8", "--list-only", *WORKDIR_FILTERS,
        "--include=*/", *keep, "--exclude=*", "--prune-empty-dirs", f"{workdir}/",
    ]  # fmt: skip


def parse_listing(output: str) -> list[str]:
    """The file paths (relative, POSIX) of `rsync --list-only` output; directories left out.
    A line is `PERMS SIZE DATE TIME NAME`, a symlink's NAME ending in ` -> TARGET`."""
    paths = []
    for line in output.splitlines():
        fields = line.split(None, 4)
        if len(fields) < 5 or line.startswith("d"):
            continue
        name = fields[4]
        if line.startswith("l"):
            name = name.partition(" -> ")[0]
        paths.append(name)
    return paths


def synced_files(workdir: Path, patterns: Sequence[str]) -> list[str] | None:
    """The files of `workdir` matching `patterns` that the sync sends, relative POSIX paths;
    None when rsync could not list them (not installed, an unreadable folder, too slow)."""
    try:
        done = subprocess.run(
            listing_argv(workdir, patterns),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=LIST_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_listing(done.stdout) if done.returncode == 0 else None
