"""The venvs of a clone: heavy dependencies shared by every clone, orch itself per clone.

    <cache>/<shared key>/           the dependencies of one Python and one set of pins, no orch;
                                    every clone with the same pins (CI's fresh clones too) uses it
    <cache>/clones/<clone key>/     this clone's own thin venv (`.venv` links to the main one):
                                    orch installed editable from this clone, a .pth that puts the
                                    shared site-packages after its own, and the shared venv's
                                    commands (torchrun, pytest, ...) run by this venv's python

<cache> is ORCH_VENV_CACHE, else $XDG_CACHE_HOME/orch-venv, else ~/.cache/orch-venv. A shared
venv is keyed by its Python's version and the pins (pyproject.toml); a clone venv by the clone's
absolute path and the flavour, so `make setup` in one clone never re-points another's orch.

    python3.11 scripts/venvs.py main      build or reuse this clone's main venv (torch included);
                                          prints its directory
    python3 scripts/venvs.py others       the same without torch for each other supported Python
                                          found on the PATH or under pyenv; prints `VERSION DIR`
                                          lines, and says on stderr which were not found

Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_PYTHON = "3.11"  # the main venv's Python: the one the nodes' images hold
OTHER_PYTHONS = ("3.12", "3.13")  # supported too; their venvs have no torch
BASE_TOOLS = ["pip>=24", "setuptools>=68", "wheel"]
COMPLETE = ".complete"  # written last: a shared venv without it is rebuilt
LAYER = ".layer"  # a clone venv's record of what it was built from


def cache_root(env: Mapping[str, str]) -> Path:
    """Where the venvs live: ORCH_VENV_CACHE, else $XDG_CACHE_HOME/orch-venv, else
    ~/.cache/orch-venv."""
    if env.get("ORCH_VENV_CACHE"):
        return Path(env["ORCH_VENV_CACHE"])
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(cache) / "orch-venv"


def requirements(pyproject: Mapping, with_torch: bool) -> list[str]:
    """What a shared venv holds: the dependencies and the dev extra, plus, for the main venv,
    the trainer extra narrowed to the exact releases of `[tool.orch.setup] main-pins`."""
    project = pyproject["project"]
    extras = project["optional-dependencies"]
    reqs = list(project["dependencies"]) + list(extras["dev"])
    if with_torch:
        reqs += list(extras["trainer"]) + list(pyproject["tool"]["orch"]["setup"]["main-pins"])
    return reqs


def shared_key(python_version: str, reqs: list[str]) -> str:
    """The shared venv's directory name: the Python's minor version (for people reading the
    cache) and a digest of its full version and the requirements, in any order."""
    minor = ".".join(python_version.split(".")[:2])
    pins = {"python": python_version, "requirements": sorted(reqs)}
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:16]
    return f"py{minor}-{digest}"


def clone_key(clone_root: Path, flavour: str) -> str:
    """A clone venv's directory name: the flavour (`main`, `py3.12`) and a digest of the clone's
    absolute path, so two clones never share one and the same clone always finds its own."""
    digest = hashlib.sha256(str(clone_root.resolve()).encode()).hexdigest()[:16]
    return f"{digest}-{flavour}"


def layer_record(clone_root: Path, shared_dir: Path, pyproject_bytes: bytes) -> str:
    """What a clone venv was built from; a clone venv whose record differs is rebuilt (another
    shared venv, a moved clone, or a pyproject.toml with other entry points or package data)."""
    digest = hashlib.sha256(pyproject_bytes).hexdigest()[:16]
    return f"{clone_root.resolve()}\n{shared_dir}\n{digest}\n"


def site_packages(venv: Path, python_version: str) -> Path:
    minor = ".".join(python_version.split(".")[:2])
    return venv / "lib" / f"python{minor}" / "site-packages"


def command_text(text: bytes, shared_python: str, own_python: str) -> bytes | None:
    """A shared venv's console script rewritten to run under this clone's python (its shebang,
    or pip's `'''exec'` line for long paths); None for a file that is not such a script."""
    head, sep, rest = text.partition(b"\n")
    second, sep2, body = rest.partition(b"\n")
    shared, own = shared_python.encode(), own_python.encode()
    if head == b"#!" + shared:
        return b"#!" + own + sep + rest
    if head == b"#!/bin/sh" and shared in second:
        return head + sep + second.replace(shared, own) + sep2 + body
    return None


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (two setups building one venv wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def run(argv: list[str | Path]) -> None:
    subprocess.run([str(a) for a in argv], check=True, stdout=sys.stderr)


def version_of(python: Path | str) -> str | None:
    """The full version of a Python interpreter, or None when it does not run (a pyenv shim
    of a version that is not selected fails)."""
    try:
        out = subprocess.run(
            [str(python), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def find_python(minor: str, env: Mapping[str, str]) -> Path | None:
    """A Python of this minor version: `python<minor>` on the PATH when it runs, else the
    newest pyenv build of it (under $PYENV_ROOT, default ~/.pyenv)."""
    found = shutil.which(f"python{minor}", path=env.get("PATH"))
    if found and (version_of(found) or "").startswith(minor + "."):
        return Path(found)
    pyenv = Path(env.get("PYENV_ROOT") or Path(env.get("HOME", "~")).expanduser() / ".pyenv")
    builds = [
        p / "bin" / f"python{minor}"
        for p in (pyenv / "versions").glob(f"{minor}.*")
        if re.fullmatch(rf"{re.escape(minor)}\.\d+", p.name)
    ]
    builds.sort(key=lambda p: int(p.parent.parent.name.split(".")[2]), reverse=True)
    for build in builds:
        if (version_of(build) or "").startswith(minor + "."):
            return build
    return None


def ensure_shared(python: Path, version: str, reqs: list[str], cache: Path) -> Path:
    """The shared venv of this Python and these requirements, built when missing or unfinished."""
    venv = cache / shared_key(version, reqs)
    with locked(cache / f"{venv.name}.lock"):
        if (venv / COMPLETE).exists():
            return venv
        print(f"building the shared venv {venv} (a few minutes, once)", file=sys.stderr)
        shutil.rmtree(venv, ignore_errors=True)
        run([python, "-m", "venv", venv])
        run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--upgrade", *BASE_TOOLS])
        run([venv / "bin" / "python", "-m", "pip", "install", "-q", *reqs])
        (venv / COMPLETE).touch()
    return venv


def ensure_clone(
    python: Path, version: str, shared: Path, flavour: str, clone_root: Path, cache: Path
) -> Path:
    """This clone's venv over `shared`: rebuilt (in seconds, torch is not reinstalled) when it
    is missing, unfinished, or was built from something else."""
    venv = cache / "clones" / clone_key(clone_root, flavour)
    record = layer_record(clone_root, shared, (clone_root / "pyproject.toml").read_bytes())
    with locked(cache / "clones" / f"{venv.name}.lock"):
        layer = venv / LAYER
        if layer.exists() and layer.read_text() == record and (venv / "bin" / "orch").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        run([python, "-m", "venv", "--without-pip", venv])
        # After this venv's own site-packages, so that this clone's orch is the one imported;
        # addsitedir also reads the shared venv's own .pth files.
        shared_site = site_packages(shared, version)
        (site_packages(venv, version) / "_orch_shared.pth").write_text(
            f"import site; site.addsitedir({str(shared_site)!r})\n"
        )
        own_python = venv / "bin" / "python"
        run([own_python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "-e", clone_root])  # fmt: skip
        link_commands(shared, venv)
        layer.write_text(record)
    return venv


def link_commands(shared: Path, venv: Path) -> None:
    """Put the shared venv's commands in this venv's bin: scripts rewritten to run under this
    venv's python (torchrun on a local node then imports this clone's orch), anything else
    linked."""
    own_bin = venv / "bin"
    shared_python, own_python = str(shared / "bin" / "python"), str(own_bin / "python")
    for entry in sorted((shared / "bin").iterdir()):
        target = own_bin / entry.name
        if (
            entry.is_dir()
            or target.exists()
            or target.is_symlink()
            or entry.name.startswith(("python", "activate"))
        ):
            continue
        text = command_text(entry.read_bytes(), shared_python, own_python)
        if text is None:
            target.symlink_to(entry)
        else:
            target.write_bytes(text)
            target.chmod(0o755)


def prune_clones(cache: Path) -> None:
    """Remove clone venvs whose clone no longer exists (each is a few hundred kilobytes)."""
    for layer in (cache / "clones").glob(f"*/{LAYER}"):
        clone_path = Path(layer.read_text().split("\n", 1)[0])
        if not (clone_path / "pyproject.toml").exists():
            shutil.rmtree(layer.parent, ignore_errors=True)


def setup(python: Path, with_torch: bool, flavour: str, clone_root: Path) -> Path:
    """Build or reuse the shared venv and this clone's venv over it; returns the clone venv."""
    version = version_of(python)
    if version is None:
        raise SystemExit(f"{python} does not run")
    pyproject = tomllib.loads((clone_root / "pyproject.toml").read_text())
    cache = cache_root(os.environ)
    shared = ensure_shared(python, version, requirements(pyproject, with_torch), cache)
    return ensure_clone(python, version, shared, flavour, clone_root, cache)


def main(argv: list[str]) -> int:
    if argv == ["main"]:
        prune_clones(cache_root(os.environ))
        print(setup(Path(sys.executable), True, "main", ROOT))
        return 0
    if argv == ["others"]:
        for minor in OTHER_PYTHONS:
            python = find_python(minor, os.environ)
            if python is None:
                print(
                    f"no Python {minor} found (python{minor} on the PATH or under pyenv): "
                    "its tests do not run here",
                    file=sys.stderr,
                )
                continue
            print(f"{minor} {setup(python, False, f'py{minor}', ROOT)}", flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
