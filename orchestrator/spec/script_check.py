"""Whether a job's `run` and `setup` name Python scripts and modules its workdir holds (pure).

A user reads `run: python train.py` and looks for train.py beside the spec; this module does
the same before anything is launched, so a misnamed script is told at submit (a warning, an
error with `orch submit --strict`) rather than by a failed run on every node.

What is read, in each command of the text (split at `;`, `&&`, `||`, `|`, `&` and newlines,
words as the shell splits them, with `shlex`):

- `python X.py`, `python3 -u X.py`, `/path/to/python3.11 X.py`: the script `X.py`;
- `python -m pkg.mod`: the module, resolved against the directory the command runs in, as
  `python -m` does (`pkg/mod.py`, `pkg/mod/__main__.py`; a package needs `__main__.py`);
- `torchrun ... X.py`, `accelerate launch ... X.py`, `deepspeed ... X.py`,
  `python -m torch.distributed.run ... X.py`: the first word ending in `.py`;
- leading `NAME=value` assignments, `env`, `exec`, `nohup`, `time`, `uv run`, `poetry run`
  are looked through; `cd DIR` (a relative DIR) moves where the later commands run.

Anything it cannot read is not warned about: a path with `$`, `~`, a glob or outside the
workdir, an absolute path, a script that does not end in `.py`, a command it does not know,
`python -c`, text that does not split. A module whose top-level package is not in the workdir
is only questioned when it is not installed on this machine, no `PYTHONPATH` is set, `setup`
installs nothing, and the workdir holds a module of a close name. A script that `setup`
names (it may make it) is not questioned in `run`.
"""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["script", "module"]

_SEPARATORS = "();<>|&\n"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)*)?$")
_UNREADABLE = re.compile(r"[$`*?\[\]{}~]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PREFIXES = {"exec", "nohup", "time", "command", "builtin"}
_RUNNERS = {"uv", "poetry", "pipenv", "pdm", "hatch", "rye"}  # `X run python ...`
_LAUNCHERS = {"torchrun", "deepspeed"}
_LAUNCHER_MODULES = {
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
    "deepspeed.launcher.runner",
}
_PYTHON_VALUED = set("WX")  # python options whose value follows (`-W ignore`, `-X dev`)
_INSTALLS = re.compile(
    r"\b(?:pip|pip3|uv|poetry|conda|mamba|pdm|setup\.py)\b.*\binstall\b|\bsync\b"
)
MAX_SUGGESTIONS = 3
CUTOFF = 0.6  # difflib's ratio a name must reach to be suggested
FEW_FILES = 3  # without a close name, the scripts of the directory are listed when this few


@dataclass(frozen=True)
class Target:
    """A script or module a command runs, as a path the workdir can be asked about."""

    kind: Kind
    written: str  # as the command writes it: "train.py", "pkg.mod"
    cwd: str  # where the command runs, relative to the workdir ("" for the workdir itself)
    pythonpath: bool = False  # the command sets PYTHONPATH for itself

    @property
    def path(self) -> str:
        """A script's workdir-relative path (normalised); a module's dotted name."""
        if self.kind == "module":
            return self.written
        return posixpath.normpath(posixpath.join(self.cwd, self.written))


@dataclass(frozen=True)
class ScriptWarning:
    """A script or module of `run` or `setup` the nodes will not find in the workdir."""

    field: str  # "run" or "setup"
    kind: Kind
    written: str  # as the command writes it
    path: str  # workdir-relative path of a script; dotted name of a module
    suggestions: tuple[str, ...] = ()  # close names the workdir holds, written as the command would
    ignored: bool = False  # it is in the local workdir, but .gitignore/.orchignore leave it out
    package: bool = False  # a module that is a package without __main__.py

    def message(self) -> str:
        """One line: what is missing, where, and what may have been meant."""
        what = f"{self.field}: python {'-m ' if self.kind == 'module' else ''}{self.written}"
        if self.ignored:
            problem = f"{self.path} is left out of the sync by .gitignore or .orchignore"
        elif self.package:
            problem = f"{self.path} is a package without __main__.py, which -m needs"
        elif self.kind == "module":
            problem = f"no module {self.path} in the workdir"
        else:
            problem = f"{self.path} is not in the workdir"
        hint = ""
        if self.suggestions:
            hint = f"; did you mean {_either(self.suggestions)}?"
        return f"{what}: {problem}{hint}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "kind": self.kind,
            "written": self.written,
            "path": self.path,
            "suggestions": list(self.suggestions),
            "ignored": self.ignored,
            "message": self.message(),
        }


def _either(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


# --- reading a command ---------------------------------------------------------------------


def _words(command: str) -> list[str] | None:
    """The command's words, separators as words of their own; None when it does not split."""
    lexer = shlex.shlex(command.replace("\\\n", " "), posix=True, punctuation_chars=_SEPARATORS)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: not read
        return None


def _commands(words: list[str]) -> Iterator[list[str]]:
    current: list[str] = []
    for word in words:
        if word and all(char in _SEPARATORS for char in word):
            if current:
                yield current
            current = []
        else:
            current.append(word)
    if current:
        yield current


def targets(command: str) -> list[Target]:
    """Every script and module `command` runs that this module can read, in order."""
    words = _words(command)
    if words is None:
        return []
    found: list[Target] = []
    cwd: str | None = ""
    for simple in _commands(words):
        pythonpath = False
        while simple and _ASSIGNMENT.match(simple[0]):
            pythonpath |= simple[0].startswith("PYTHONPATH=")
            simple = simple[1:]
        simple = _unwrapped(simple)
        if not simple:
            continue
        if simple[0] == "cd":
            cwd = _moved(cwd, simple[1:])
            continue
        if cwd is None:
            continue  # somewhere this module cannot follow
        for kind, written in _run_targets(simple):
            target = Target(kind, written, cwd, pythonpath)
            if kind == "module" or not target.path.startswith("../"):
                found.append(target)  # a script outside the workdir is not its to hold
    return found


def _unwrapped(words: list[str]) -> list[str]:
    """`words` without the wrappers that run the rest as it is (`exec`, `env A=1`, `uv run`)."""
    while words:
        if words[0] in _PREFIXES:
            words = words[1:]
        elif words[0] == "env":
            words = words[1:]
            while words and _ASSIGNMENT.match(words[0]):
                words = words[1:]
        elif words[0] in _RUNNERS and len(words) > 1 and words[1] == "run":
            words = words[2:]
        else:
            return words
    return words


def _moved(cwd: str | None, args: list[str]) -> str | None:
    """Where `cd ARGS` leaves a command that ran in `cwd` (None: where this cannot follow)."""
    if cwd is None or len(args) != 1 or args[0].startswith(("/", "-")):
        return None
    if _UNREADABLE.search(args[0]):
        return None
    moved = posixpath.normpath(posixpath.join(cwd, args[0]))
    if moved == ".":
        return ""
    return None if moved == ".." or moved.startswith("../") else moved


def _run_targets(words: list[str]) -> list[tuple[Kind, str]]:
    program = posixpath.basename(words[0])
    if _PYTHON.match(program):
        return _python_targets(words[1:])
    if program in _LAUNCHERS:
        return _launched(words[1:])
    if program == "accelerate" and len(words) > 1 and words[1] == "launch":
        return _launched(words[2:])
    return []


def _python_targets(args: list[str]) -> list[tuple[Kind, str]]:
    """What `python ARGS` runs: a script, a module (and what a launcher module runs), or
    nothing this module reads (`-c`, stdin, an option it does not know)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("--") or arg == "-":
            return []  # --version, --help, a long option with a value, or stdin
        if not arg.startswith("-"):
            break
        for j, flag in enumerate(arg[1:], start=1):
            rest = arg[j + 1 :]
            if flag == "c":
                return []
            if flag == "m":
                module = rest or (args[i + 1] if i + 1 < len(args) else "")
                after = args[i + 1 :] if rest else args[i + 2 :]
                return _module_targets(module, after)
            if flag in _PYTHON_VALUED:
                i += 0 if rest else 1
                break
        i += 1
    if i >= len(args):
        return []
    return _script(args[i])


def _module_targets(module: str, args: list[str]) -> list[tuple[Kind, str]]:
    if not module or not all(_IDENTIFIER.match(part) for part in module.split(".")):
        return []
    found: list[tuple[Kind, str]] = [("module", module)]
    if module in _LAUNCHER_MODULES:
        found += _launched(args)
    return found


def _launched(args: list[str]) -> list[tuple[Kind, str]]:
    """The script of a launcher's ARGS: the first word ending in .py that is not an option."""
    for arg in args:
        if arg in ("-m", "--module"):
            return []  # a module among the launcher's own options: not read
        if not arg.startswith("-") and arg.endswith(".py"):
            return _script(arg)
    return []


def _script(word: str) -> list[tuple[Kind, str]]:
    if not word.endswith(".py") or word.startswith("/") or _UNREADABLE.search(word):
        return []
    return [("script", word)]


# --- checking against the workdir ----------------------------------------------------------


def check_commands(
    commands: Mapping[str, str | None],
    synced: Collection[str],
    *,
    on_disk: Collection[str] = (),
    installed: Collection[str] = (),
    env: Collection[str] = (),
) -> list[ScriptWarning]:
    """The warnings for `commands` (field -> its text: "setup", "run"), given the workdir's
    Python files the sync sends (`synced`: workdir-relative POSIX paths ending in .py).

    `on_disk`: workdir-relative paths of scripts that are in the local workdir though not
    synced (left out by .gitignore or .orchignore); `installed`: top-level module names this
    machine can import; `env`: the names the job's `env` sets (PYTHONPATH among them puts a
    module out of reach of this check). A script `setup` names is not questioned in `run`.
    """
    synced_set = frozenset(synced)
    setup = commands.get("setup") or ""
    warnings: list[ScriptWarning] = []
    for field, text in commands.items():
        if not text:
            continue
        for target in targets(text):
            if target.kind == "script":
                found = _check_script(field, target, synced_set, on_disk, setup)
            else:
                reachable = "PYTHONPATH" not in env and not target.pythonpath
                installs = bool(_INSTALLS.search(setup))
                found = _check_module(field, target, synced_set, installed, reachable, installs)
            if found is not None and found not in warnings:
                warnings.append(found)
    return warnings


def _check_script(
    field: str, target: Target, synced: frozenset[str], on_disk: Collection[str], setup: str
) -> ScriptWarning | None:
    path = target.path
    if path in synced:
        return None
    if field == "run" and posixpath.basename(path) in setup:
        return None  # setup may make it
    if path in on_disk:
        return ScriptWarning(field, "script", target.written, path, ignored=True)
    scripts = sorted(synced)
    # compared without ".py", which every name shares and which would make any two alike
    stems = {script.removesuffix(".py"): script for script in scripts}
    close = [
        stems[stem]
        for stem in difflib.get_close_matches(
            path.removesuffix(".py"), list(stems), n=MAX_SUGGESTIONS, cutoff=CUTOFF
        )
    ]
    if not close:
        here = [p for p in scripts if posixpath.dirname(p) == posixpath.dirname(path)]
        close = here if len(here) <= FEW_FILES else []
    shown = tuple(posixpath.relpath(p, target.cwd or ".") for p in close)
    return ScriptWarning(field, "script", target.written, path, shown)


def _modules(synced: frozenset[str], cwd: str) -> dict[str, bool]:
    """Module name -> whether `python -m` runs it, for the Python files under `cwd`."""
    prefix = f"{cwd}/" if cwd else ""
    modules: dict[str, bool] = {}
    for path in synced:
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) : -len(".py")].split("/")
        if not all(_IDENTIFIER.match(part) for part in parts):
            continue
        if parts[-1] == "__main__" and len(parts) > 1:
            modules[".".join(parts[:-1])] = True
        elif parts[-1] == "__init__" and len(parts) > 1:
            modules.setdefault(".".join(parts[:-1]), False)
        else:
            modules[".".join(parts)] = True
        for depth in range(1, len(parts) - 1):  # namespace packages on the way
            modules.setdefault(".".join(parts[:depth]), False)
    return modules


def _check_module(
    field: str,
    target: Target,
    synced: frozenset[str],
    installed: Collection[str],
    reachable: bool,
    installs: bool,
) -> ScriptWarning | None:
    if not reachable:
        return None
    modules = _modules(synced, target.cwd)
    name = target.written
    top = name.split(".")[0]
    if modules.get(name):
        return None
    if name in modules:  # a package without __main__.py
        return ScriptWarning(field, "module", name, name, package=True)
    runnable = sorted(module for module, runs in modules.items() if runs)
    close = tuple(difflib.get_close_matches(name, runnable, n=MAX_SUGGESTIONS, cutoff=CUTOFF))
    if top not in modules and (top in installed or installs or not close):
        return None  # installed here, by setup, or not the workdir's: not this check's to say
    return ScriptWarning(field, "module", name, name, close)
