"""Pure parts of `orch submit --remote`: which arguments go to the host's `orch submit`, which
secrets travel with them, the spec as the host sees it (paths under its submission folder, no
secret's value) and the one command that submits it there.

Secrets never reach any command line nor any file the laptop sends: a `--secret NAME=VALUE`
becomes `--secret NAME` there, a spec's inline `secrets: {NAME: value}` becomes `NAME: null` in
the host's copy of the spec, and their values, like that of every spec secret listed without a
value, are sent over SSH stdin (`secrets_text`) and read by the host's shell into the
environment of its `orch submit` (`submit_command`), never written to a file there. The host's
orch then keeps them where it always does: the job's `env.json` (0600).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.host.layout import HostLayout, orch_command
from orchestrator.spec.mounts import S3
from orchestrator.spec.values import expand_references

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


def inline_secrets(spec: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """The values of the spec's secrets given inline (`NAME: value`), as the spec loader reads
    them: `$NAME` and `${NAME}` expanded from this shell (`environ`, the submitting shell), `$$`
    one `$`, numbers and booleans as text. Raises SpecError (naming the secret, never showing
    its value) for a value that is not a string, number or boolean, or that names a variable
    this shell lacks."""
    listed = spec.get("secrets")
    if not isinstance(listed, Mapping):
        return {}
    values: dict[str, str] = {}
    for name, value in listed.items():
        if value is None:
            continue  # from this shell: `spec_secrets`
        if isinstance(value, bool):
            values[str(name)] = "true" if value else "false"
        elif isinstance(value, int | float | Decimal):
            values[str(name)] = str(value)
        elif isinstance(value, str):
            try:
                values[str(name)] = expand_references(
                    value, environ, unset_hint="export it before orch submit ($$ for a $)"
                )
            except ValueError as exc:
                raise SpecError(f"secrets.{name}: {exc}") from None
        else:
            raise SpecError(
                f"secrets.{name}: must be a string, number or boolean (its value is not shown)"
            )
    return values


def secrets_text(secrets: Mapping[str, str]) -> str:
    """The secrets as `export NAME='value'` lines, for the host's shell to read from stdin."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in secrets.items())


def submit_command(layout: HostLayout, folder: str, args: Sequence[str]) -> str:
    """The one command that submits the spec of the submission `folder` on the host: its
    shell reads the secrets (`secrets_text`) from stdin into the environment of `orch submit
    FOLDER/job.yaml ARGS` (never into a file or an argument). The spec's copy is removed once
    that orch has taken the job (its record holds the spec), and the whole folder when it did
    not; the workdir and data stay for the job's nodes (the host's daemon removes them when
    the job ends, `leftovers`). Exits with orch's status."""
    q = shlex.quote
    submit = orch_command(layout, ["submit", f"{folder}/job.yaml", *args], secrets_on_stdin=True)
    return (
        f"({submit}); code=$?; rm -f {q(folder + '/job.yaml')}; "
        f'[ "$code" = 0 ] || rm -rf {q(folder)}; exit "$code"'
    )


def host_spec(spec: dict[str, Any], submission: str) -> dict[str, Any]:
    """The spec with its workdir and local data sources moved under `submission` on the host
    (a bucket source stays as written: the nodes download it), and
    each secret listed by name only (`NAME: null`: its value travels over stdin, see the
    module docstring)."""
    moved = dict(spec)
    if isinstance(spec.get("secrets"), Mapping):
        moved["secrets"] = dict.fromkeys(spec["secrets"])
    moved["workdir"] = f"{submission}/work"
    moved["data"] = [
        item if is_bucket_item(item) else {**item, "src": f"{submission}/data/{i}"}
        for i, item in enumerate(spec.get("data") or [])
    ]
    if not moved["data"]:
        moved.pop("data")
    return moved


def is_bucket_item(item: object) -> bool:
    """Whether a spec's `data` entry (as read from YAML, unchecked) has a bucket source: it
    is not sent to the host, whose nodes download it themselves."""
    return isinstance(item, Mapping) and str(item.get("src", "")).startswith(S3)


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
