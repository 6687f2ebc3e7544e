"""Before a submit: do `setup` and `run` name scripts and modules the nodes will find?

The reading and the rule are `spec.script_check` (pure); this module asks the local machine
what they need: the workdir's Python files as the sync sends them (rsync with the sync's own
filters), which missing scripts are there but ignored, and which modules this machine can
import. When the workdir cannot be listed, nothing is questioned.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchestrator.errors import SpecError
from orchestrator.remote.workdir_listing import synced_files
from orchestrator.spec.model import LoadedJob
from orchestrator.spec.script_check import ScriptWarning, check_commands, targets


def script_warnings(loaded: LoadedJob) -> list[ScriptWarning]:
    """What `setup` and `run` of `loaded` run that its workdir does not hold (see
    `spec.script_check`); empty when everything is found or cannot be told."""
    spec = loaded.spec
    commands = {"setup": spec.setup, "run": spec.run}
    wanted = [target for text in commands.values() if text for target in targets(text)]
    if not wanted:
        return []
    synced = synced_files(loaded.workdir, ["*.py"])
    if synced is None:
        return []
    scripts = {t.path for t in wanted if t.kind == "script"}
    tops = {t.written.split(".")[0] for t in wanted if t.kind == "module"}
    return check_commands(
        commands,
        synced,
        on_disk={path for path in scripts if _is_file(loaded.workdir, path)},
        installed={top for top in tops if _importable(top)},
        env=set(spec.env),
    )


def refuse(warnings: list[ScriptWarning]) -> None:
    """`orch submit --strict`: a SpecError (exit 2) listing the warnings, when there are any."""
    if warnings:
        raise SpecError(
            "\n".join(warning.message() for warning in warnings),
            hint="fix run/setup in the spec (or the workdir), or submit without --strict",
        )


def _is_file(workdir: Path, relative: str) -> bool:
    return not relative.startswith("../") and (workdir / relative).is_file()


def _importable(name: str) -> bool:
    """Whether this machine's Python finds top-level module `name` (nothing is imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
