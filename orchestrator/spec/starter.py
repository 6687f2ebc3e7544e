"""Starter job specs for `orch init`: a commented job.yaml for the user's own script.

The templates are package data (`orchestrator/templates/<name>.yaml`, shipped in the wheel):
`script` runs the user's `python train.py` under torchrun, `demo` runs orch's reference trainer
(`orch_trainer`) on synthetic data. `render_starter` fills a template in for the directory the
file goes to (pure but for looking for its requirements.txt); `write_starter` writes it, never
over an existing file unless told to. What both write is a spec `load_job` accepts as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

from orchestrator.errors import OrchError

TemplateName = Literal["script", "demo"]
TEMPLATES: tuple[TemplateName, ...] = get_args(TemplateName)
"""The starters `orch init --template` offers; the first is the default."""

DEFAULT_FILE = "job.yaml"
REQUIREMENTS = "requirements.txt"
_FALLBACK_NAME = "my-job"
_NAME_LIMIT = 63


class StarterError(OrchError):
    """The starter cannot be written where asked (the file exists, no such directory): a usage
    mistake, exit 2."""

    exit_code = 2


@dataclass(frozen=True)
class Starter:
    """A written starter spec."""

    path: Path  # the file written (absolute)
    template: TemplateName  # which starter
    name: str  # the job name in it
    setup: str | None  # its setup command; None when there was no requirements.txt
    replaced: bool  # True when it overwrote a file (--force)


def template_text(template: TemplateName) -> str:
    """The raw text of `template` (one of TEMPLATES), read from the package's data."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}: choose one of {', '.join(TEMPLATES)}")
    return resources.files("orchestrator").joinpath("templates", f"{template}.yaml").read_text()


def job_name_for(directory: Path) -> str:
    """A valid job name from `directory`'s name (`My Project_2` -> `my-project-2`), or
    `my-job` when nothing of it is usable."""
    words = re.sub(r"[^a-z0-9]+", "-", directory.name.lower()).strip("-")
    words = re.sub(r"^[^a-z]+", "", words)[:_NAME_LIMIT].rstrip("-")
    return words or _FALLBACK_NAME


def setup_for(directory: Path) -> str | None:
    """The setup command for a job in `directory`: installing its requirements.txt, if any."""
    return f"pip install -r {REQUIREMENTS}" if (directory / REQUIREMENTS).is_file() else None


def render_starter(template: TemplateName, name: str, setup: str | None) -> str:
    """`template` filled in: the job `name`, and `setup` (or a commented-out example)."""
    setup_line = (
        f"setup: {setup}"
        if setup
        else f"# setup: pip install -r {REQUIREMENTS}    (no {REQUIREMENTS} here yet)"
    )
    return template_text(template).replace("@NAME@", name).replace("@SETUP@", setup_line)


def target_path(path: Path | None) -> Path:
    """Where the starter goes: `path` (a directory gets job.yaml inside), default ./job.yaml."""
    target = Path(DEFAULT_FILE) if path is None else path.expanduser()
    if target.is_dir():
        target = target / DEFAULT_FILE
    return target.absolute()


def write_starter(path: Path | None, template: TemplateName = "script", *, force: bool) -> Starter:
    """Write the `template` starter to `target_path(path)` and say what was written.

    The job is named after the file's directory and installs its requirements.txt when one is
    there. Raises StarterError (exit 2) when the file exists and not `force`, or when its
    directory does not exist; ValueError for a template not in TEMPLATES.
    """
    target = target_path(path)
    existed = target.exists()
    if existed and not force:
        raise StarterError(
            f"{target} exists already; orch init leaves it as it is",
            hint="pass --force to overwrite it, or give another path: orch init PATH",
        )
    directory = target.parent
    if not directory.is_dir():
        raise StarterError(
            f"directory {directory} does not exist", hint=f"create it first: mkdir -p {directory}"
        )
    name, setup = job_name_for(directory), setup_for(directory)
    target.write_text(render_starter(template, name, setup))
    return Starter(path=target, template=template, name=name, setup=setup, replaced=existed)
