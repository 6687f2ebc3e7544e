"""Which files of a local workdir a sync would send: asked of rsync itself, with the sync's own
filters (`sync.WORKDIR_FILTERS`: `.gitignore`, `.orchignore`, no `.git`), so the answer is
the sync's to the letter, whatever those files say.

    synced_files(workdir, "ckpt")   # the regular files under workdir/ckpt a sync would send
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from orchestrator.remote.sync import WORKDIR_FILTERS, literal_pattern

LIST_TIMEOUT_S = 60.0  # a workdir rsync cannot list in this time is not looked at


def list_argv(workdir: Path, under: str) -> list[str]:
    """rsync argv listing the files a workdir sync sends, only below `under` (a folder of the
    workdir, '/'-separated; "" for the whole workdir): the folders on the way to it are walked,
    every other entry is left out by the filters after the sync's own."""
    scope: list[str] = []
    if under:
        parts = [literal_pattern(part) for part in under.strip("/").split("/")]
        scope = [f"--filter=+ /{'/'.join(parts[: i + 1])}/" for i in range(len(parts) - 1)]
        scope += [f"--filter=+ /{'/'.join(parts)}/***", "--filter=- *"]
    return [
        "rsync", "--recursive", "--list-only", "--no-human-readable",
        *WORKDIR_FILTERS, *scope, f"{workdir}/",
    ]  # fmt: skip


# `-rw-r--r--  512000 2025/01/31 12:00:00 path/of the file`: one space before the path
_ENTRY = re.compile(r"^(\S+)\s+\d+ \S+ \S+ (.+)$")


def parse_listing(text: str) -> list[str]:
    """The regular files of a `--list-only` listing, by their path in the workdir. Entries
    whose names rsync had to escape (control characters) are left out: no checkpoint is named
    so (`checkpoint_files.refused_name`)."""
    files: list[str] = []
    for line in text.split("\n"):
        entry = _ENTRY.match(line)
        if entry and entry[1].startswith("-") and "\\#" not in entry[2]:
            files.append(entry[2])
    return files


def synced_files(workdir: Path, under: str = "") -> list[str] | None:
    """The regular files below `under` that a sync of `workdir` sends (`list_argv`); None when
    rsync could not list them (missing, failed, or slower than `LIST_TIMEOUT_S`)."""
    try:
        done = subprocess.run(
            list_argv(workdir, under), capture_output=True, text=True,
            errors="surrogateescape", timeout=LIST_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode not in (0, 23, 24):  # 23, 24: some files vanished or were unreadable
        return None
    return parse_listing(done.stdout)
