"""Pure parts of `orch submit --remote`: which arguments go to the host's `orch submit`, which
secrets travel with them, and the spec as the host sees it (paths under its submission folder).

Secrets never reach any command line: a `--secret NAME=VALUE` becomes `--secret NAME` there, and
its value, like that of every spec secret listed without a value, goes into the environment
file sent over SSH stdin (`secrets_file_text`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import SpecError

ROUTING_FLAGS = ("--remote", "--no-remote")


@dataclass(frozen=True)
class RemoteArgs:
    """The host's `orch submit` arguments (spec path left out) and the secrets to send."""

    spec_index: int  # position of the spec file in the original arguments
    args: list[str]  # the other arguments, as the host gets them
    secrets: dict[str, str] = field(default_factory=dict)  # NAME -> value, sent over stdin


def split_args(argv: Sequence[str], spec_index: int, environ: Mapping[str, str]) -> RemoteArgs:
    """`argv` (after `submit`) without routing flags, `--detach` added, `--secret` values
    moved out of it."""
    args: list[str] = []
    secrets: dict[str, str] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if i == spec_index or item in ROUTING_FLAGS or item == "--detach":
            i += 1
            continue
        if item == "--secret" or item.startswith("--secret="):
            value = item.partition("=")[2] if "=" in item else None
            if value is None:
                if i + 1 >= len(items):
                    raise SpecError("--secret needs NAME or NAME=VALUE")
                value, i = items[i + 1], i + 1
            name, has, secret = value.partition("=")
            if not has:
                if name not in environ:
                    raise SpecError(f"--secret {name}: ${name} is not set in this shell")
                secret = environ[name]
            secrets[name] = secret
            args += ["--secret", name]
        else:
            args.append(item)
        i += 1
    return RemoteArgs(spec_index=spec_index, args=[*args, "--detach"], secrets=secrets)


def spec_secrets(spec: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """Values of the spec's secrets listed without a value (`NAME: null`), from this shell;
    those unset here are left for the host's orch to refuse with its own message."""
    listed = spec.get("secrets") or {}
    return {n: environ[n] for n, v in listed.items() if v is None and n in environ}


def secrets_file_text(secrets: Mapping[str, str]) -> str:
    """The secrets as `export NAME='value'` lines, for the host's shell to source."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in secrets.items())


def host_spec(spec: dict[str, Any], submission: str) -> dict[str, Any]:
    """The spec with its workdir and data sources moved under `submission` on the host."""
    moved = dict(spec)
    moved["workdir"] = f"{submission}/work"
    moved["data"] = [
        {**item, "src": f"{submission}/data/{i}"} for i, item in enumerate(spec.get("data") or [])
    ]
    if not moved["data"]:
        moved.pop("data")
    return moved


def moved_record(document: Any, old_folder: str, new_folder: str) -> Any:
    """A job record (`job.json`) with every path under the host's submission folder
    `old_folder` moved under `new_folder` (the same submission on a new host)."""
    if isinstance(document, dict):
        return {key: moved_record(value, old_folder, new_folder) for key, value in document.items()}
    if isinstance(document, list):
        return [moved_record(value, old_folder, new_folder) for value in document]
    if isinstance(document, str) and (
        document == old_folder or document.startswith(old_folder.rstrip("/") + "/")
    ):
        return new_folder.rstrip("/") + document[len(old_folder.rstrip("/")) :]
    return document
